"""What a reader of a translation notices that BLEU, chrF and TER hide: numbers that change, loops, ``<unk>``.

A translation that turns "63%" into "23 p. 100" loses one 4-gram of BLEU and the reader's trust; one that says "à
Ottawa, à Ottawa, à Ottawa" loses little chrF. Three figures, per hypothesis file, each counted line by line:

- **numbers carried**: the numbers of the source line (a multiset: a number written twice must be carried twice)
  found in the translation of that line, summed over the corpus, as a share of all the source's numbers; the same
  share for the reference (the ceiling: references drop numbers too, and convert units, "50ft" → "15 m"); and the
  lines where the translation has a number beyond the source's (invented, changed, or repeated by a loop). A share
  of the source's numbers, not a precision over the translation's, because a dropped or changed amount is the error
  a reader cannot repair; the invented lines say the other half.
- **repeats**: the lines whose translation has a word n-gram more than once where the reference has it fewer times
  (a loop the reference does not excuse), and, plainly, the lines with any repeated n-gram.
- **<unk>**: occurrences of ``<unk>`` per line, and the lines with at least one.

Numbers are the digit runs of a line read by its language's convention. English groups thousands with ``,`` (or
a space: "£38 000 million" is in news-test-2014's source) and marks decimals with ``.``; French and the other
decimal-comma languages group with a space, U+00A0, U+202F, U+2009 or ``.`` and mark decimals with ``,``. A ``,`` or
``.`` before exactly three digits is read by the line's own language ("1,234" is 1234 in English, 1.234 in French),
so a French translation that keeps the English "120,296 personnes" does not carry the source's 120296: a French
reader would misread it too. A ``,`` or ``.`` before any other number of digits can only be a decimal mark, in
either language ("1.5 million" in French is still 1.5). Grouping needs a leading group of one to three digits and
groups of exactly three ("en 1999 300 personnes" is 1999 and 300). Values keep no leading zeros and no trailing
decimal zeros ("3,50" = "3.5"; "09" = "9"). Letters around digits are ignored: "1st" and "1er" are both 1, and "de1
000" (a glued reference) is 1000. French "p. 100" or "pour 100" after a number is the Hansards' percent sign, no
number ("63 p. 100" = "63 %" = "63%": the 63 counts).

Three rewritings that a correct translation makes are read as the same numbers, because the references make them
too (measured on news-test-2014, they are most of what separated its reference from its source): times, as the
24-hour hour and the minutes unless 00 ("9.30pm" = "21h30" = 21 and 30; "5am" = "5h00" = 5); French centuries in
Roman numerals ("XIXe" = 19, as "19th"); and a magnitude word after a number, written as a power of ten ("CAD 1,360
million" is 1360e6, "1,36 milliard" 1.36e9: the same amount; "32,6 Md$", "1,5 M£", "£38m", "$2bn", French "billion"
= English "trillion"). A translation's number carries a source's when the amounts are equal, or when the written
values are equal and one side has no magnitude word ("$325 million and $340 million" = "entre 325 et 340 M$"), so
"2.2 billion" → "2,2 billions" (the false friend, 1,000 times more) is not carried. Numbers in words ("nine", "cinq")
are not numbers: a translation that writes "9 ans" for "nine-year-old" invents one, as the reference may.

A number is carried only as a whole: numbers joined by a dash, a slash or a colon with nothing between them are one
number ("2001-2002", "30/03/2013", "3:16"), so a range written backwards ("2002-2001") or with one end changed does
not carry the source's, nor do its pieces elsewhere in the line; a range's ends written apart on the other side, in
its order, do ("$4-5 million" = "de 4 à 5 millions", "a 5-4 vote" = "5 votes contre 4"), and a year range's short
end is the year it abbreviates ("2010-11" = "2010-2011"). A time with minutes is one number ("9.30pm" = "21h30" =
21:30, whose 30 is not the one of "page 30"). Where both languages are English or French, the month a date names is
a number too ("30 March 2013" = "March 30, 2013" = "le 30 mars 2013": 30, month 3, 2013; a month's name beside no day
or year, "in March" or "Theresa May", is none), so a translation that changes the month changes a number. A line
that lacks one of the source's numbers and has one beyond them *changes* one, and the report names those lines.

Repeats are counted on whitespace tokens of the text as given (detokenized, punctuation attached, case-sensitive):
what the reader sees, and a loop repeats itself exactly; folding case or splitting punctuation would count more of
the repetitions that fluent text has too. An n-gram is counted against the reference's count of the same n-gram,
so "de la" in a reference that says it twice excuses a translation that says it twice, not three times.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal

UNK = "<unk>"  # nmtkit.data.vocab.SPECIALS[1], the token an out-of-shortlist word becomes
# languages whose decimal mark is the comma (and whose thousands separators are spaces or dots); others read as English
DECIMAL_COMMA = frozenset("fr de es it pt nl ru pl cs sk ro tr sv da fi nb nn no is hu bg uk hr sl sr lt lv et el "
                          "ca eu gl id vi".split())
SPACES = " \u00a0\u202f\u2009"
_CANDIDATE = re.compile(r"[0-9]+(?:[ \u00a0\u202f\u2009.,][0-9]+)*")
_PERCENT_FR = re.compile(r"(?<=[0-9])([ \u00a0\u202f\u2009]?(?:p\.|pour)[ \u00a0\u202f\u2009]?)100(?![0-9])")
_TIME_12H = re.compile(r"(?<![0-9.,])([0-9]{1,2})(?:[.:]([0-9]{2}))?[ \u00a0\u202f]?([ap])\.?m\b\.?", re.IGNORECASE)
_TIME_COLON = re.compile(r"(?<![0-9.,:])([0-9]{1,2}):([0-9]{2})(?![0-9])")
_TIME_FR = re.compile(r"(?<![0-9.,])([0-9]{1,2})[ \u00a0\u202f]?h(?:[ \u00a0\u202f]?([0-9]{2}))?(?![0-9A-Za-zÀ-ÿ])")
_CENTURY_FR = re.compile(r"\b([IVX]{1,5})(?:e|ème)\b")
_ROMAN = {"I": 1, "V": 5, "X": 10}
# the words that scale the number before them, as powers of ten; French "billion" is English "trillion"; English
# "m" (million) only after a currency sign ("£38m"; "50m" is a length), French "M" only before one ("1,5 M£")
_SP = "[ \u00a0\u202f]?"
_CUR = "(?:[$€£]" + _SP + ")?"  # a currency sign may come between: "5 250 $ millions"
_MAGNITUDES = {
    "en": (re.compile("[ \u00a0\u202f-]?" + _CUR + r"(?i:(thousand|million|billion|trillion|bn|tn)s?|(m))\b"),
           {"thousand": 3, "million": 6, "billion": 9, "trillion": 12, "bn": 9, "tn": 12, "m": 6}),
    "fr": (re.compile(_SP + _CUR + r"(?:(?i:(million|milliard|billion)s?)\b|(Mds?)\b|(M)(?=" + _SP + r"[$€£]))"),
           {"million": 6, "milliard": 9, "billion": 12, "md": 9, "mds": 9, "m": 6}),
}
# what joins numbers into one ("2001-2002", "30/03/2013", "21:30"): the character alone, between digits
_JOINERS = {"-": "-", "\u2010": "-", "\u2011": "-", "\u2013": "-", "\u2014": "-", "/": "/", ":": ":"}
_PLAIN = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?")  # (one number's value, as _read and magnitudes write it)
# month names (English capitalised, with the usual abbreviations; French in either case), as the month's number; a
# date's month is a number ("month 3"), its day and year the numbers they are
_MONTH_NAMES = {
    "en": ["January Jan", "February Feb", "March Mar", "April Apr", "May", "June Jun", "July Jul", "August Aug",
           "September Sept Sep", "October Oct", "November Nov", "December Dec"],
    "fr": ["janvier", "février fevrier", "mars", "avril", "mai", "juin", "juillet", "août aout", "septembre",
           "octobre", "novembre", "décembre decembre"],
}
_MONTHS = {lang: {w: k + 1 for k, names in enumerate(table) for w in names.split()}
           for lang, table in _MONTH_NAMES.items()}


def _date_pattern(lang: str) -> re.Pattern:
    """A day and a month's name (either order; English "of" and ordinals), then perhaps a year; or a month and a
    year.  English names only capitalised ("may 5" is no date); French ones in either case."""
    month = "|".join(sorted(_MONTHS[lang], key=len, reverse=True))
    day = "[0-9]{1,2}"
    return re.compile(rf"(?<![0-9.,])(?:(?P<d1>{day})(?:st|nd|rd|th|er|e)?{_SP}(?:of )?(?P<m1>{month})\.?"
                      rf"|(?P<m2>{month})\.?{_SP}(?P<d2>{day})(?:st|nd|rd|th)?(?![0-9])|(?P<m3>{month})\.?)"
                      rf"(?:,?{_SP}(?P<y>[0-9]{{4}}))?(?![0-9A-Za-zÀ-ÿ])", re.IGNORECASE if lang == "fr" else 0)


_DATES = {lang: _date_pattern(lang) for lang in _MONTHS}


def _months(text: str, lang: str) -> list[tuple[int, str]]:
    """The months a line's dates name, as (where the name is, "month N"): a month's name beside a day or a year
    ("30 March", "March 30", "mars 2013"); alone ("in March", "Theresa May") it is no number."""
    out = []
    for m in _DATES[lang].finditer(text):
        day, group = m["d1"] or m["d2"], next(g for g in ("m1", "m2", "m3") if m[g])
        if (day and 1 <= int(day) <= 31) or m["y"]:
            out.append((m.start(group), f"month {_MONTHS[lang][m[group] if lang == 'en' else m[group].lower()]}"))
    return out


def _time(hour: str, minutes: str | None, pm: bool = False, am: bool = False) -> str:
    """A time as the number a reader compares, between ';' (which joins no digit group): the 24-hour hour, and its
    minutes after a colon unless they are 00 ("9.30pm" → 21:30, one number; "5h00" → 5)."""
    h = int(hour)
    h = h + 12 if pm and h < 12 else 0 if am and h == 12 else h
    return f";{h}:{minutes};" if minutes and minutes != "00" else f";{h};"


def _roman(m: re.Match) -> str:
    values = [_ROMAN[c] for c in m.group(1)]
    total = sum(-v if k + 1 < len(values) and v < values[k + 1] else v for k, v in enumerate(values))
    return f";{total};"


def _convention(lang: str) -> tuple[str, str]:
    """(decimal mark, thousands separators) of a language."""
    return (",", SPACES + ".") if lang.lower() in DECIMAL_COMMA else (".", SPACES + ",")


def _value(integer: str, decimals: str) -> str:
    integer, decimals = integer.lstrip("0") or "0", decimals.rstrip("0")
    return f"{integer}.{decimals}" if decimals else integer


def _read(candidate: str, decimal: str, thousands: str) -> list[str]:
    """The numbers of one run of digit groups joined by single separators (see the module's docstring)."""
    parts = re.split(r"([^0-9])", candidate)
    groups, seps = parts[0::2], [None] + parts[1::2]
    out, i = [], 0
    while i < len(groups):
        integer, decimals, kind, j = groups[i], "", None, i + 1
        while j < len(groups):
            sep, group = seps[j], groups[j]
            sep_kind = " " if sep in SPACES else sep
            if (sep in thousands and sep != decimal and len(group) == 3 and len(groups[i]) <= 3
                    and kind in (None, sep_kind)):
                integer, kind, j = integer + group, sep_kind, j + 1
            elif sep in ",." and (sep == decimal or len(group) != 3):
                decimals, j = group, j + 1
                break
            else:
                break
        out.append(_value(integer, decimals))
        i = j
    return out


def numbers(text: str, lang: str, dates: bool = True) -> list[str]:
    """The numbers of a line by ``lang``'s convention, as values, in order: "1 234,5" in French → "1234.5",
    "1,36 milliard" → "1.36e9" (a magnitude word as a power of ten), "2001-2002" and "21h30" → "21:30" (one number
    each), "30 mars 2013" → "30", "month 3", "2013" (a date's month, with ``dates``, in English and French)."""
    text = _TIME_12H.sub(lambda m: _time(m[1], m[2], pm=m[3].lower() == "p", am=m[3].lower() == "a"), text)
    text = _TIME_COLON.sub(lambda m: _time(m[1], m[2]), text)
    if lang.lower() == "fr":
        text = _PERCENT_FR.sub(lambda m: m.group(1), text)
        text = _TIME_FR.sub(lambda m: _time(m[1], m[2]), text)
        text = _CENTURY_FR.sub(_roman, text)
    months = _months(text, lang.lower()) if dates and lang.lower() in _DATES else []
    decimal, thousands = _convention(lang)
    magnitude, powers = _MAGNITUDES.get(lang.lower(), (None, {}))
    out, end = [], None
    for m in _CANDIDATE.finditer(text):
        while months and months[0][0] < m.start():
            out.append(months.pop(0)[1])
            end = None
        values = _read(m.group(0), decimal, thousands)
        joiner = _JOINERS.get(text[end:m.start()]) if end is not None and m.start() == end + 1 else None
        if joiner:  # one number with the one before: "2001-2002", "30/3/2013", "21:30"
            first = values.pop(0)
            out[-1] += joiner + (first.zfill(2) if joiner == ":" and first.isdigit() else first)
        out += values
        end = m.end()
        word = magnitude.match(text, m.end()) if magnitude else None
        if word and not (lang.lower() == "en" and word[2] and text[m.start() - 1:m.start()] not in ("£", "$", "€")):
            out[-1] += f"e{powers[next(g for g in word.groups() if g).lower()]}"
    return [_whole_years(v) for v in out] + [month for _, month in months]


def _whole_years(value: str) -> str:
    """A year range with a short end as the years it names ("2010-11" → "2010-2011", "1999-00" → "1999-2000")."""
    m = re.fullmatch(r"([12][0-9]{3})-([0-9]{1,2})", value)
    if not m:
        return value
    start = int(m[1])
    end = start - start % 100 + int(m[2])
    return f"{start}-{end if end > start else end + 100}"


def ngram_counts(line: str, n: int) -> Counter:
    """The word n-grams of a line (whitespace tokens as given) with their counts."""
    words = line.split()
    return Counter(tuple(words[k:k + n]) for k in range(len(words) - n + 1))


def excess_repeats(hypothesis: str, reference: str | None, n: int) -> list[str]:
    """The n-grams the hypothesis has more than once and more often than the reference (every repeated one
    without a reference), each as its words joined by spaces."""
    ref = ngram_counts(reference, n) if reference is not None else Counter()
    return [" ".join(g) for g, c in ngram_counts(hypothesis, n).items() if c > 1 and c > ref[g]]


def _equal(a: str, b: str) -> bool:
    """The same amount; numbers joined into one ("2001-2002", "21:30", "30/3/2013") and months only as written."""
    if _PLAIN.fullmatch(a) and _PLAIN.fullmatch(b):
        return Decimal(a) == Decimal(b)
    return a == b


def _same_digits(a: str, b: str) -> bool:
    """The same written value where one side has no magnitude ("325" = "325e6": "$325 million and $340 million" =
    "entre 325 et 340 M$")."""
    return ("e" not in a or "e" not in b) and a.partition("e")[0] == b.partition("e")[0]


def _either(a: str, b: str) -> bool:
    return _equal(a, b) or _same_digits(a, b)


def compare_numbers(source: list[str], translation: list[str]) -> tuple[int, list[str], list[str]]:
    """(how many of the source's numbers the translation carries, the ones it lacks, the ones it has beyond the
    source's), as multisets: equal amounts pair first, then equal written values where one has no magnitude; then
    a range of one side whose ends the other writes apart, in its order ("$4-5 million" = "de 4 à 5 millions", "a
    5-4 vote" = "5 votes contre 4"; "2002-2001" is not "2001-2002", nor is "de 2002 à 2001")."""
    s, t, carried = dict(enumerate(source)), dict(enumerate(translation)), 0  # (position → number, unpaired)
    for same in (_equal, _same_digits):
        for i in list(s):
            k = next((k for k in t if same(s[i], t[k])), None)
            if k is not None:
                del s[i], t[k]
                carried += 1
    for ranges, apart, source_range in ((s, t, True), (t, s, False)):
        for i in [i for i, value in ranges.items() if "-" in value]:
            ends = ranges[i].split("-")
            k = next((k for k in apart if all(k + j in apart and _either(e, apart[k + j])
                                              for j, e in enumerate(ends))), None)
            if k is not None:
                del ranges[i]
                for j in range(len(ends)):
                    del apart[k + j]
                carried += 1 if source_range else len(ends)
    return carried, sorted(s.values()), sorted(t.values())


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


class Diagnostics:
    """The figures of every hypothesis file of one corpus: the source's and reference's side is read once.

    ``source`` may be None: the numbers are then not checked (``numbers`` is None in every result). Shares are
    fractions (0..1), None where nothing was counted; line numbers in the per-line lists are 1-based.
    """

    def __init__(self, references: Sequence[str], source: Sequence[str] | None, source_lang: str, target_lang: str,
                 n: int = 3):
        if n < 1:
            raise ValueError(f"the repeated n-gram needs n >= 1 (got {n})")
        self.references, self.n, self.target_lang = list(references), n, target_lang
        # (a date's month is a number only where both sides can name it: else an English source's "30 March" would
        # lack its month in every German translation)
        self.dates = source_lang.lower() in _DATES and target_lang.lower() in _DATES
        self.source_numbers = None if source is None else [numbers(s, source_lang, self.dates) for s in source]
        self.reference = {"numbers": self._numbers(self.references), "repeats": self._any_repeats(self.references)}

    def _numbers(self, lines: Sequence[str]) -> dict | None:
        if self.source_numbers is None:
            return None
        carried = of = invented_lines = 0
        per_line, changed = [], []
        for k, (src, line) in enumerate(zip(self.source_numbers, lines)):
            got, missing, invented = compare_numbers(src, numbers(line, self.target_lang, self.dates))
            carried, of, invented_lines = carried + got, of + len(src), invented_lines + bool(invented)
            if missing or invented:
                per_line.append({"line": k + 1, "missing": missing, "invented": invented})
            if missing and invented:  # (one of the source's numbers written as another)
                changed.append(k + 1)
        return {"carried": carried, "of": of, "share": _share(carried, of), "invented_lines": invented_lines,
                "changed_lines": changed, "lines": per_line}

    def _any_repeats(self, lines: Sequence[str]) -> dict:
        count = sum(1 for line in lines if any(c > 1 for c in ngram_counts(line, self.n).values()))
        return {"lines": count, "share": _share(count, len(lines))}

    def of(self, hypotheses: Sequence[str]) -> dict:
        """``{"numbers": None | {"carried", "of", "share", "invented_lines", "changed_lines": [the numbers of the
        lines with both], "lines": [{"line", "missing", "invented"}] (the lines with either)}, "repeats": {"n",
        "lines", "share", "any_lines", "any_share", "where": [{"line", "ngrams"}]}, "unk": {"total", "per_line",
        "lines", "share"}}``."""
        where = [{"line": k + 1, "ngrams": grams} for k, (h, r) in enumerate(zip(hypotheses, self.references))
                 if (grams := excess_repeats(h, r, self.n))]
        plain = self._any_repeats(hypotheses)
        unks = [h.count(UNK) for h in hypotheses]  # glued ones too: "d'<unk>", "<unk>,"
        size = len(hypotheses)
        return {
            "numbers": self._numbers(hypotheses),
            "repeats": {"n": self.n, "lines": len(where), "share": _share(len(where), size),
                        "any_lines": plain["lines"], "any_share": plain["share"], "where": where},
            "unk": {"total": sum(unks), "per_line": _share(sum(unks), size),
                    "lines": sum(1 for u in unks if u), "share": _share(sum(1 for u in unks if u), size)},
        }


SHOWN_LINES = 10  # (the changed lines the text report names; --json has them all)


def _changed(lines: list[int]) -> str:
    """ "2 lines change one (lines 3, 7)": the lines that write a source's number as another, the first named."""
    n = len(lines)
    text = f"{n:,} line{' changes' if n == 1 else 's change'} one"
    if n:
        text += f" (line{'s' if n > 1 else ''} {', '.join(map(str, lines[:SHOWN_LINES]))}"
        text += ", …)" if n > SHOWN_LINES else ")"
    return text


def summary(result: dict, reference: dict) -> str:
    """One line of :meth:`Diagnostics.of`'s result for the text report, with the reference's figures beside."""
    parts = []
    nums, ref_nums = result["numbers"], reference["numbers"]
    if nums is not None:
        invented = f"{nums['invented_lines']:,} line{' invents' if nums['invented_lines'] == 1 else 's invent'} one"
        if nums["of"]:
            ref = f"; reference {ref_nums['share']:.1%}" if ref_nums else ""
            parts.append(f"numbers {nums['share']:.1%} carried ({nums['carried']:,} of {nums['of']:,}{ref}), "
                         f"{invented}, {_changed(nums['changed_lines'])}")
        else:
            parts.append(f"numbers: none in the source, {invented}")
    rep = result["repeats"]
    if rep["share"] is not None:
        parts.append(f"repeats {rep['share']:.1%} of lines (any {rep['any_share']:.1%}, reference any "
                     f"{reference['repeats']['share']:.1%})")
    unk = result["unk"]
    if unk["per_line"] is not None:
        parts.append(f"<unk> {unk['per_line']:.2f}/line ({unk['share']:.1%} of lines)")
    return " · ".join(parts)
