"""The catalogue: the types (:class:`Download`, :class:`DataFile`, :class:`Dataset`, :class:`Resolved`), the entries
(:data:`CATALOGUE`) with their reference checksums, and :func:`lookup`. Policy: see :mod:`nmtkit.datasets`."""

from __future__ import annotations

from dataclasses import dataclass

from nmtkit.datasets import hansards
from nmtkit.errors import InputError

CONVERSIONS = ("copy", "gunzip", "sgml-text", "tsv-gz:0", "tsv-gz:1", "hansards")
KINDS = ("tgz", "tar", "zip", "gz", "text")


# -- the catalogue's types ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Download:
    """One file at a public address: the unit that is downloaded, checksummed and cached."""

    name: str  # file name in CACHE/downloads/
    url: str
    kind: str  # tgz, tar, zip, gz or text
    sha256: str | None = None  # None: not known to nmtkit -> trust on first use (see the module docstring)
    size: int | None = None  # bytes, when known
    note: str = ""

    @property
    def policy(self) -> str:
        """How a download is checked: ``"sha256"`` (a known checksum) or ``"trust-on-first-use"``."""
        return "sha256" if self.sha256 else "trust-on-first-use"


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset: where it lies (layout path), what it should be, and how it is made from a download."""

    path: str  # layout path, relative: the same in a mirror ($NMTKIT_DATA) and under CACHE/data/
    download: Download
    member: str | None = None  # the archive member it is made from (hansards: their folder); None: the download
    convert: str = "copy"  # copy, gunzip, sgml-text, tsv-gz:N, hansards (sitting files joined: see .hansards)
    sha256: str | None = None  # of the reference copy (the shared mirror's); None where nmtkit has none
    size: int | None = None  # bytes of the reference copy
    text_sha256: str | None = None  # of a .gz reference copy's decompressed text: a file made with other gzip
    #                                 settings has other bytes, and this says whether it holds the same text


@dataclass(frozen=True)
class Dataset:
    """A catalogue entry: a parallel corpus as two files, English and French (line i translates line i), and any
    files that go with them (``align``: gold word alignments, one line per pair)."""

    name: str
    description: str
    files: dict  # language code -> DataFile
    pairs: int | None = None  # sentence pairs, when known
    licence: str = ""
    homepage: str = ""

    def file(self, lang: str) -> DataFile:
        if lang not in self.files:
            raise InputError(f"dataset {self.name} has no '{lang}' file (it has {', '.join(self.files)})")
        return self.files[lang]


@dataclass(frozen=True)
class Resolved:
    """Where a dataset's files are on this machine (:func:`get`)."""

    name: str
    files: dict  # language -> Path
    origins: dict  # language -> "mirror", "cache", "http-mirror" or "publisher"

    @property
    def prefix(self) -> str:
        """``PREFIX`` when the files are ``PREFIX.en``/``PREFIX.fr`` (``.gz`` allowed), else ``SRC,TGT``: the two
        forms ``nmt-prepare`` and ``nmt-select`` accept."""
        paths = [str(p) for p in self.files.values()]
        stems = set()
        for lang, p in zip(self.files, paths):
            stem = p.removesuffix(".gz")
            if not stem.endswith("." + lang):
                return ",".join(paths)
            stems.add(stem.removesuffix("." + lang))
        return stems.pop() if len(stems) == 1 else ",".join(paths)


# -- the catalogue ------------------------------------------------------------------------------------------------

STATMT = "https://www.statmt.org"
WMT14_DEV = Download("wmt14-dev.tgz", f"{STATMT}/wmt14/dev.tgz", "tgz",
                     note="WMT'14 development sets (news-test 2008-2013, many languages), plain text and SGML")
WMT14_TEST = Download("wmt14-test-full.tgz", f"{STATMT}/wmt14/test-full.tgz", "tgz",
                      note="WMT'14 test sets, full versions, SGML")
EUROPARL = Download("training-parallel-europarl-v7.tgz", f"{STATMT}/wmt13/training-parallel-europarl-v7.tgz", "tgz")
COMMONCRAWL = Download("training-parallel-commoncrawl.tgz", f"{STATMT}/wmt13/training-parallel-commoncrawl.tgz",
                       "tgz")
UN = Download("training-parallel-un.tgz", f"{STATMT}/wmt13/training-parallel-un.tgz", "tgz")
NEWS_COMMENTARY = Download("training-parallel-nc-v9.tgz", f"{STATMT}/wmt14/training-parallel-nc-v9.tgz", "tgz")
GIGA_FREN = Download("training-giga-fren.tar", f"{STATMT}/wmt10/training-giga-fren.tar", "tar")
TATOEBA = Download("tatoeba-fra-eng.zip", "https://www.manythings.org/anki/fra-eng.zip", "zip",
                   note="replaced in place by each new release: the mirror holds the 2019-04-07 one")
MULTI30K = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
HANSARDS = Download(hansards.HOUSE_TRAINING, f"{hansards.ISI}/{hansards.HOUSE_TRAINING}", "tar",
                    note="ISI Aligned Hansards of the 36th Parliament of Canada, release 2001-1a, House debates, "
                    "training part: a plain tar of gzip files, one per sitting and side, ISO-8859-1")

# sha256 and size of the shared mirror's copies (computed from ../shared/data; see the checksum policy above)
_REFERENCE = {
    "wmt14/newstest2012.en": ("f9e51f85c4948033fc7d77ef427f4d88908a8dd3f778970f62d0baafac3ff97e", 381734),
    "wmt14/newstest2012.fr": ("29aa5aff172127f6adf5625cc2f8e44f579d524700e84f1ec0eb14f4f19719e4", 440985),
    "wmt14/newstest2013.en": ("ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e", 332974),
    "wmt14/newstest2013.fr": ("909b63be5df3eb8c13e1d5967bf3f0adfdb9f6ed5e638c5bffff563ee2ff7f41", 393465),
    "wmt14/newstest2014.en": ("9a12cb6e8efb3509ebede627e4a9c83ee64935509d561ff70f4b7bd5f93f6096", 375106),
    "wmt14/newstest2014.fr": ("2bd07dc204f965bf88e90adb6223a8cb850f9bf9840df6af1f4945195936656e", 445720),
    "wmt14/sgm/newstest2014-fren-src.en.sgm": ("5521ed9b1d07763c7e8d7ddfc0fda269cd114612a6283bd3836979ea4dd10a26",
                                               441845),
    "wmt14/sgm/newstest2014-fren-ref.fr.sgm": ("c57025c8a338c642fe3ad0206ddc75d258a5584e1d470b75f37af2fb666d7e93",
                                               514587),
    "wmt-news-older/news-test2008.en": ("134e1140848bb0d05e774dbe35b8b69602faf401250c03dbb437bdbe38c37b6f", 263240),
    "wmt-news-older/news-test2008.fr": ("e212f59bb002d73a1bfebdcf101a6c51db3ccfd8a3115cc8a18414b6ee2a28f9", 301220),
    "wmt-news-older/newssyscomb2009.en": ("b734a44294fa3b23a2491cd9a2c59fb5eb71332ace70b2c9039978863dd0e43d", 62557),
    "wmt-news-older/newssyscomb2009.fr": ("bf74d7a28aa72aa79cbff02bec00a14983f65616dd37ee53e17a37e9d933505e", 70529),
    "wmt-news-older/newstest2009.en": ("3fc92718e7b994ca0a5dc57e63b68d5c80244a56e5bb1cec11d2e8dd10b3ff3c", 345562),
    "wmt-news-older/newstest2009.fr": ("2f4f17f73c3b927a3a0ba4cc082f22f70dd396d7d71cd14e160940207f5f6958", 391108),
    "wmt-news-older/newstest2010.en": ("1ebece77e333965cbc66fde735a6f17e026b4d6690f4f7fdaba839b7bdadac3b", 328648),
    "wmt-news-older/newstest2010.fr": ("131ee7deb0ea517bdd6a85ca5f6f5ca3136c5f76daba426ef4dde3d60b9e66a9", 383398),
    "wmt-news-older/newstest2011.en": ("d387569743c0fa9097df4d4e2c1dd9e6ba9ef3cee6e0f473da3204c887dcf8fd", 396884),
    "wmt-news-older/newstest2011.fr": ("9631ea545acf4b921add6baba856b03efae9f0de4c330a314091b3f925506c7f", 456618),
    "tatoeba/fra-eng.en.gz": ("625a056ed473a0548adbede97cdc42f148e9903ecc42b236a4b6056b0d554673", 1264005),
    "tatoeba/fra-eng.fr.gz": ("2f832acaaf0a241e8636e6464634556006cf10f17ce6c336c1bcb0aad85662b1", 1729646),
    "multi30k/train.en": ("460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6", 1801238),
    "multi30k/train.fr": ("5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d", 2111303),
    "multi30k/val.en": ("1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227", 63297),
    "multi30k/val.fr": ("5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc", 73924),
    "multi30k/test_2016_flickr.en": ("399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182", 62076),
    "multi30k/test_2016_flickr.fr": ("cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6", 72261),
    "hansards/train.en.gz": ("def31cb68e649d107a605545f262492b4beb81f3cdef6fbba598ef52dca05dc2", 26517247),
    "hansards/train.fr.gz": ("0c36143cf25a9c4b6067846138f61859b1d8221fa4320670a47ad354a1c56ce1", 29912113),
    "hansards/dev.en": ("9e8bb888cdea2ed707ad9875105f1c83aeef419dbb3603936c7bc23803d7cefe", 479060),
    "hansards/dev.fr": ("8d18184dec6bb95fd15310c06da9dc0c1c44a5640875e7edfc2cda14757a779e", 554085),
    "hansards/test.en": ("9da84fb29cfb9287159452c61ba61c39d3e8b317ce115ba77cb24924df8b5bf0", 559178),
    "hansards/test.fr": ("324f8d6fba0955cd39f2e8a1f363b516f96b7e7f1fc86bf5465c504ac1d0628b", 658104),
    "hansards-trial/trial.e": ("bb5fb2ed59d535df2ec022d7a0b466f1315df7a3fe3261b2552158aca209d522", 4144),
    "hansards-trial/trial.f": ("b4fc275ae7b5f4cd4996e34be44d352d8478cf2cf493ba7e61ad1775d736945a", 4643),
    "hansards-trial/trial.align": ("1bfcf3340bba6153153ef9c515d70f6acd2547e207cffc74ab63dc17ded1ce39", 11820),
}
# sha256 of the decompressed text of the mirror's .gz copies that nmtkit rebuilds with its own gzip settings
_TEXT_REFERENCE = {
    "hansards/train.en.gz": "fff98888e0fb65b10261b8803c70a46812828fcbd22aa2666ec3462ebe7ca142",
    "hansards/train.fr.gz": "b79d4234f65d8218ba5c556a21efb7ce320db5501cd7b0721baaf7c8a829f515",
}


def _file(path: str, download: Download, member: str | None = None, convert: str = "copy") -> DataFile:
    sha, size = _REFERENCE.get(path, (None, None))
    return DataFile(path, download, member, convert, sha, size, _TEXT_REFERENCE.get(path))


def _pair(name: str, description: str, en: DataFile, fr: DataFile, **info) -> Dataset:
    return Dataset(name, description, {"en": en, "fr": fr}, **info)


WMT = dict(licence="WMT shared-task data, free for research",
           homepage="https://www.statmt.org/wmt14/translation-task.html")


def _catalogue() -> dict[str, Dataset]:
    sets = []
    for year, pairs in ((2012, 3003), (2013, 3000)):
        sets.append(_pair(f"newstest{year}", f"WMT news-test-{year}, plain text (the paper's development set is "
                          "news-test-2012 and 2013 together)",
                          _file(f"wmt14/newstest{year}.en", WMT14_DEV, f"dev/newstest{year}.en"),
                          _file(f"wmt14/newstest{year}.fr", WMT14_DEV, f"dev/newstest{year}.fr"), pairs=pairs, **WMT))
        sets.append(_pair(f"newstest{year}-sgm", f"WMT news-test-{year}, the official SGML",
                          _file(f"wmt14/sgm/newstest{year}-src.en.sgm", WMT14_DEV, f"dev/newstest{year}-src.en.sgm"),
                          _file(f"wmt14/sgm/newstest{year}-ref.fr.sgm", WMT14_DEV, f"dev/newstest{year}-ref.fr.sgm"),
                          pairs=pairs, **WMT))
    sgm14 = {lang: _file(f"wmt14/sgm/newstest2014-fren-{side}.{lang}.sgm", WMT14_TEST,
                         f"test-full/newstest2014-fren-{side}.{lang}.sgm")
             for lang, side in (("en", "src"), ("fr", "ref"))}
    sets.append(_pair("newstest2014", "WMT news-test-2014 (full, 176 documents), plain text: the paper's test set. "
                      "Made from the SGML as sacreBLEU does (segment texts, runs of spaces collapsed)",
                      *(DataFile(f"wmt14/newstest2014.{lang}", WMT14_TEST, sgm14[lang].member, "sgml-text",
                                 *_REFERENCE[f"wmt14/newstest2014.{lang}"]) for lang in ("en", "fr")),
                      pairs=3003, **WMT))
    sets.append(_pair("newstest2014-sgm", "WMT news-test-2014 (full), the official SGML", sgm14["en"], sgm14["fr"],
                      pairs=3003, **WMT))
    for name, pairs in (("news-test2008", 2051), ("newssyscomb2009", 502), ("newstest2009", 2525),
                        ("newstest2010", 2489), ("newstest2011", 3003)):
        sets.append(_pair(name, f"WMT {name}: older news, plain text",
                          _file(f"wmt-news-older/{name}.en", WMT14_DEV, f"dev/{name}.en"),
                          _file(f"wmt-news-older/{name}.fr", WMT14_DEV, f"dev/{name}.fr"), pairs=pairs, **WMT))
    for name, download, member, description in (
        ("europarl-v7", EUROPARL, "training/europarl-v7.fr-en", "Europarl v7 (the paper: 61M words)"),
        ("news-commentary-v9", NEWS_COMMENTARY, "training/news-commentary-v9.fr-en",
         "News commentary v9 (the paper: 5.5M words)"),
        ("un", UN, "un/undoc.2000.fr-en", "UN corpus (the paper: 421M words)"),
        ("commoncrawl", COMMONCRAWL, "commoncrawl.fr-en", "Common Crawl (one of the paper's crawled corpora)"),
    ):
        base = member.rsplit("/", 1)[-1]
        sets.append(_pair(name, f"WMT'14 en-fr training corpus: {description}",
                          _file(f"wmt14/{base}.en", download, f"{member}.en"),
                          _file(f"wmt14/{base}.fr", download, f"{member}.fr"), **WMT))
    sets.append(_pair("giga-fren", "WMT'14 en-fr training corpus: the 10^9 French-English corpus (one of the paper's "
                      "crawled corpora), gzip",
                      _file("wmt14/giga-fren.release2.fixed.en.gz", GIGA_FREN, "giga-fren.release2.fixed.en.gz"),
                      _file("wmt14/giga-fren.release2.fixed.fr.gz", GIGA_FREN, "giga-fren.release2.fixed.fr.gz"),
                      **WMT))
    sets.append(_pair("tatoeba", "Tatoeba sentence pairs (manythings.org release; the mirror's is of 2019-04-07): "
                      "short everyday sentences, roughly sorted by length, gzip",
                      _file("tatoeba/fra-eng.en.gz", TATOEBA, "fra.txt", "tsv-gz:0"),
                      _file("tatoeba/fra-eng.fr.gz", TATOEBA, "fra.txt", "tsv-gz:1"), pairs=153496,
                      licence="CC-BY 2.0 FR; attribution: www.manythings.org/anki and tatoeba.org",
                      homepage="https://www.manythings.org/anki/"))
    for split, pairs in (("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)):
        name = "multi30k-" + {"train": "train", "val": "val", "test_2016_flickr": "test2016"}[split]
        files = [_file(f"multi30k/{split}.{lang}", Download(f"multi30k-{split}.{lang}.gz",
                                                           f"{MULTI30K}/{split}.{lang}.gz", "gz"), None, "gunzip")
                 for lang in ("en", "fr")]
        sets.append(_pair(name, f"Multi30K task 1, {split}: human translations of image captions", *files,
                          pairs=pairs, licence="non-commercial research and education use",
                          homepage="https://github.com/multi30k/dataset"))
    sets.extend(_hansards())
    return {d.name: d for d in sets}


def _hansards() -> list[Dataset]:
    """The Canadian Hansards splits of the shared mirror, and the NAACL 2003 trial alignments (sources, layout and
    confidence: :mod:`nmtkit.datasets.hansards`)."""
    info = dict(licence="no licence stated; the Parliament of Canada's public record; research use",
                homepage=f"{hansards.ISI}/")
    out = []
    for split, pairs, what in (("train", 914450, "301 sittings, gzip: the large training corpus"),
                               ("dev", 5423, "sittings 36.1/100-101, not in train"),
                               ("test", 6525, "sittings 36.1/197-198, not in train")):
        files = [_file(path, HANSARDS, hansards.MEMBER_DIR, "hansards") for path, (s, _) in hansards.LAYOUT.items()
                 if s == split]
        out.append(_pair(f"hansards-{split}", f"Canadian House of Commons debates 1997-2000 (ISI Aligned Hansards, "
                         f"36th Parliament), {split}: {what}. Whole sitting files joined in the order of the mirror's "
                         "sittings.tsv, ISO-8859-1 made UTF-8, untokenized", *files, pairs=pairs, **info))
    trial = {}
    for key, ext in (("en", "e"), ("fr", "f"), ("align", "align")):
        path = f"hansards-trial/trial.{ext}"
        sha, size = _REFERENCE[path]
        download = Download(f"berkeleyaligner-trial.{ext}", f"{hansards.BERKELEY}/trial.{ext}", "text", sha, size,
                            note="the Berkeley Aligner's copy, at a fixed commit: the mirror's bytes")
        trial[key] = _file(path, download)
    out.append(Dataset("hansards-trial", "Canadian Hansards gold word alignments, NAACL 2003 shared task trial set "
                       "(Och & Ney annotation): trial.e/.f tokenized, lowercased, wrapped as <s snum=N> ... </s>; "
                       "trial.align 0-based f-e links, -P = possible", trial, pairs=37,
                       licence="research and education use (Berkeley Aligner distribution)",
                       homepage="https://github.com/mhajiloo/berkeleyaligner"))
    return out


CATALOGUE: dict[str, Dataset] = _catalogue()


def catalogue() -> list[Dataset]:
    """The catalogue's datasets, in order."""
    return list(CATALOGUE.values())


def lookup(name: str | Dataset) -> Dataset:
    """A dataset by name (an unknown name is an InputError that lists the known ones)."""
    if isinstance(name, Dataset):
        return name
    if name not in CATALOGUE:
        raise InputError(f"unknown dataset '{name}'; known: {', '.join(CATALOGUE)}")
    return CATALOGUE[name]
