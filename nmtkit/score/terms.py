"""Term use (``nmt-score --terms FILE``): how many of a glossary's terms found in the source lines the translations
write -- the WMT terminology tasks' exact-match term-use rate (Dinu et al. 2019; Alam et al. 2021).

The glossary is ``nmt-translate --terms``' file (:mod:`nmtkit.translate.glossary`).  Its source terms are found in
each source line's Moses-tokenised words (longest first, each once, by case unless ``ignore_case``), as
``nmt-translate`` finds them; a term is **used** where one of its target variants stands in the translation's
Moses-tokenised words as whole words, in the same case.  The reference's own rate is given beside a system's: the
share of the terms its translators wrote as the glossary does."""

from __future__ import annotations

from collections.abc import Sequence

from nmtkit.translate import glossary


class TermUse:
    """The terms each source line requires, read once for every hypothesis file of a corpus."""

    def __init__(self, path: str, source: Sequence[str], source_lang: str, target_lang: str,
                 ignore_case: bool = False):
        from nmtkit.data.text import Preprocessor, TextConfig

        self.src_pre, self.tgt_pre = Preprocessor(TextConfig(source_lang)), Preprocessor(TextConfig(target_lang))
        self.glossary = glossary.CompiledGlossary(glossary.read(path), self.src_pre.words, self.tgt_pre.words,
                                                  ignore_case=ignore_case, name=path)
        self.required = [self.glossary.find(self.src_pre.words(line)) for line in source]

    def of(self, translations: Sequence[str]) -> dict:
        """``{"used", "of", "share", "lines": [{"line", "missed": [source terms]}] (the lines that miss one)}``."""
        used = of = 0
        lines = []
        for k, (terms, text) in enumerate(zip(self.required, translations)):
            if not terms:
                continue
            words = self.tgt_pre.words(text)
            missed = [self.glossary.terms[i].source for i in terms
                      if not any(stands_in(words, v) for v in self.glossary.terms[i].variants)]
            used, of = used + len(terms) - len(missed), of + len(terms)
            if missed:
                lines.append({"line": k + 1, "missed": missed})
        return {"used": used, "of": of, "share": used / of if of else None, "lines": lines}


def stands_in(words: list[str], phrase: tuple[str, ...]) -> bool:
    """Whether ``phrase`` (words) stands in ``words`` as consecutive words."""
    n = len(phrase)
    return any(tuple(words[k: k + n]) == phrase for k in range(len(words) - n + 1))


def summary(result: dict, reference: dict | None) -> str:
    """The text report's words for :meth:`TermUse.of`'s result, the reference's rate beside."""
    if not result["of"]:
        return "terms: none of the glossary's in the source"
    ref = f"; reference {reference['share']:.1%}" if reference and reference["share"] is not None else ""
    return f"terms {result['share']:.1%} used ({result['used']:,} of {result['of']:,}{ref})"
