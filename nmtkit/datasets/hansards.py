"""The Canadian Hansards: the ISI sitting files the shared mirror's ``hansards/`` splits are made of, and the
``hansards`` conversion that rebuilds a split from the publisher's archive (the entries are in :mod:`.catalogue`).

**Where they are published** (found in public copies of scripts and pages; the archives themselves could not be
fetched where this was written, so nothing below was checked against them):

- *Aligned Hansards of the 36th Parliament of Canada*, release 2001-1a, Ulrich Germann, USC/ISI:
  https://www.isi.edu/natural-language/download/hansard/ . The House debates come as two uncompressed tar files,
  ``hansard.36.r2001-1a.house.debates.training.tar`` (947,969 pairs) and ``...house.debates.testing.tar`` (122,290
  pairs, two test sets), holding one gzip file per sitting and side:
  ``hansard.36/Release-2001.1a/sentence-pairs/house/debates/development/training/hansard.36.1.house.debates.001.e.gz``
  (``.f.gz`` the French), line *i* of ``.e`` aligned with line *i* of ``.f``, ISO-8859-1. Sources: the Hugging Face
  loader ``usc-isi/hansards`` (``hansards.py``: addresses, folder layout, ``decode("ISO-8859-1")``, ``strip()``; its
  dataset card: the pair counts; sizes that are multiples of 10,240 bytes, i.e. plain tar), and several training
  scripts on GitHub that download the same addresses and convert with ``iconv -f iso-8859-1``. Confidence: high for
  the addresses and the encoding, medium for the folder layout (one source, with its test fixtures).
- That the mirror's splits are whole sitting files of the *training* archive, concatenated in name order, is
  inferred, not documented: its sitting names are ISI's, its text is all within Latin-1 with no C1 controls and no
  white space at line ends, and the Berkeley Aligner's copies of sittings 001-003 (tokenized) have the same line
  counts as ``sittings.tsv`` (176, 553, 1,654). Eight sitting numbers are absent from the table (36.1: 018, 057, 097,
  135, 174, 211; 36.2: 006, 042), and its 926,398 lines are 21,571 fewer than the training archive's pairs; why is
  not known. So the conversion checks what it can: every member's line count against the table (a mismatch is an
  InputError naming the member), then the result against the mirror's sha256 (a difference is the usual warning).
- The NAACL 2003 word-alignment trial set (Mihalcea & Pedersen 2003, "An Evaluation Exercise for Word Alignment";
  workshop page http://www.eecs.umich.edu/~mihalcea/wpt/), as the Berkeley Aligner ships it
  (``resources/example/dev/trial.{e,f,align}``, 0-based ``f-e`` links, ``-P`` = possible): the GitHub export of
  code.google.com/p/berkeleyaligner, ``mhajiloo/berkeleyaligner`` at commit :data:`BERKELEY_COMMIT`, whose files are
  byte for byte the mirror's ``hansards-trial/`` (compared in a stored snapshot of that repository). Confidence: high.
"""

from __future__ import annotations

import gzip
import posixpath
import zlib
from pathlib import Path

from nmtkit.errors import InputError

ISI = "https://www.isi.edu/natural-language/download/hansard"
HOUSE_TRAINING = "hansard.36.r2001-1a.house.debates.training.tar"
HOUSE_TESTING = "hansard.36.r2001-1a.house.debates.testing.tar"  # not used: the mirror's splits are all training
MEMBER_DIR = "hansard.36/Release-2001.1a/sentence-pairs/house/debates/development/training/"
ENCODING = "iso-8859-1"
BERKELEY_COMMIT = "b074394daa36d256ced5edcd30d0850ac0614899"
BERKELEY = f"https://raw.githubusercontent.com/mhajiloo/berkeleyaligner/{BERKELEY_COMMIT}/resources/example/dev"

# The shared mirror's hansards/sittings.tsv, in its order: SESSION.NUMBER:LINES for hansard.36.SESSION.house.debates.
# NUMBER, with /dev or /test for the sittings held out of train (the tests compare this with the mirror's table).
_SITTINGS = (
    "1.001:176 1.002:553 1.003:1654 1.004:3396 1.005:1819 1.006:2985 1.007:3643 1.008:1978 1.009:3615 1.010:2174 "
    "1.011:3169 1.012:3734 1.013:1685 1.014:3844 1.015:1745 1.016:3592 1.017:3836 1.019:3804 1.020:1941 "
    "1.021:3052 1.022:3705 1.023:2212 1.024:3640 1.025:1882 1.026:2530 1.027:3281 1.028:2190 1.029:3672 "
    "1.030:1969 1.031:2982 1.032:3625 1.033:2239 1.034:3826 1.035:1985 1.036:3669 1.037:4010 1.038:4950 "
    "1.039:3778 1.040:2253 1.041:2913 1.042:5036 1.043:2473 1.044:4057 1.045:2316 1.046:4675 1.047:3158 "
    "1.048:2233 1.049:3975 1.049a:38 1.050:3287 1.051:3697 1.052:4345 1.053:3695 1.054:1832 1.055:6124 1.056:3435 "
    "1.058:3595 1.059:2448 1.060:3625 1.061:4074 1.062:3385 1.063:3465 1.064:2110 1.065:3785 1.066:3348 "
    "1.067:2173 1.068:3833 1.069:3393 1.070:4710 1.071:2145 1.072:3773 1.073:1915 1.074:3295 1.075:5062 "
    "1.076:2288 1.077:3693 1.078:3246 1.079:3820 1.080:2115 1.081:3385 1.082:1510 1.083:3282 1.084:3454 "
    "1.085:2108 1.086:3203 1.087:1920 1.088:3324 1.089:3395 1.090:2071 1.091:3293 1.092:1925 1.093:2654 "
    "1.094:4668 1.095:2108 1.096:3442 1.098:3121 1.099:3866 1.100:1815/dev 1.101:3608/dev 1.102:2130 1.103:1035 "
    "1.104:4093 1.105:2507 1.106:3837 1.107:2180 1.108:3774 1.109:3775 1.110:2105 1.111:2701 1.112:3520 "
    "1.113:3265 1.114:2300 1.115:2973 1.116:1655 1.117:4696 1.118:7431 1.118a:3883 1.119:3991 1.120:3649 "
    "1.121:1876 1.121a:51 1.122:3743 1.123:2483 1.124:1903 1.125:2235 1.126:2030 1.127:2958 1.128:3083 1.129:2033 "
    "1.130:3518 1.131:1989 1.132:3219 1.133:3265 1.134:3869 1.136:1923 1.137:3212 1.138:3719 1.139:2122 "
    "1.140:3484 1.141:1421 1.142:3435 1.143:3058 1.144:2071 1.145:3738 1.146:1988 1.147:3082 1.148:3941 "
    "1.149:2152 1.150:3550 1.151:1791 1.152:3305 1.153:3703 1.154:1865 1.155:3535 1.156:1252 1.157:3312 "
    "1.158:3576 1.159:2212 1.160:3631 1.161:1905 1.162:4983 1.163:3884 1.164:2472 1.165:3607 1.166:2231 "
    "1.167:3223 1.168:3941 1.169:904 1.170:595 1.170a:44 1.171:4991 1.172:5540 1.173:2378 1.175:1880 1.176:3315 "
    "1.177:3694 1.178:2536 1.179:3890 1.180:1726 1.181:3103 1.182:3434 1.183:3965 1.184:4017 1.185:1922 "
    "1.186:3289 1.187:3733 1.188:2234 1.189:3777 1.190:2016 1.191:2871 1.192:3850 1.193:2197 1.194:1826 "
    "1.195:2089 1.196:3673 1.197:4400/test 1.198:2125/test 1.199:4749 1.200:2010 1.201:3457 1.202:8224 "
    "1.202a:4934 1.202b:3355 1.203:2118 1.204:2817 1.205:8051 1.205a:5207 1.206:4252 1.207:2340 1.208:3871 "
    "1.209:1930 1.210:3315 1.212:1987 1.213:3042 1.214:1591 1.215:2848 1.216:3796 1.217:1929 1.218:2349 "
    "1.219:1652 1.220:3392 1.221:3561 1.222:2814 1.223:3671 1.224:1886 1.225:3501 1.226:3893 1.227:2353 "
    "1.228:3757 1.229:1501 1.230:3340 1.231:2052 1.232:3754 1.233:2184 1.234:4868 1.235:3834 1.236:2275 "
    "1.237:3667 1.238:2082 1.239:3132 1.240:5858 1.241:2930 1.242:4353 1.243:1314 1.243a:53 1.243b:38 2.001:751 "
    "2.002:3875 2.003:3684 2.004:2127 2.005:3034 2.007:2547 2.008:3228 2.009:1874 2.010:3718 2.011:3771 "
    "2.012:2300 2.013:3569 2.014:1823 2.015:3006 2.016:3627 2.017:2066 2.018:3874 2.019:2153 2.020:3415 "
    "2.021:3657 2.022:2213 2.023:3244 2.024:2062 2.025:3286 2.026:3450 2.027:2031 2.028:3423 2.029:2389 "
    "2.030:3015 2.031:3561 2.032:2131 2.033:3697 2.034:2013 2.035:5160 2.036:10804 2.036a:3190 2.036b:2341 "
    "2.036c:2469 2.036d:2833 2.037:1921 2.038:5064 2.039:3345 2.040:2583 2.041:4058 2.043:2978 2.044:4342 "
    "2.045:1829 2.046:3041 2.047:2918 2.048:2891 2.049:3221 2.050:1950 2.051:3802 2.052:2268 2.053:3033 "
    "2.054:4833 2.055:1808 2.056:2669 2.057:1923 "
)

SPLITS = ("train", "dev", "test")
# layout path -> (split, side in ISI's file names); train is gzip-compressed, as in the mirror
LAYOUT = {f"hansards/{split}.{lang}{'.gz' if split == 'train' else ''}": (split, lang[0])
          for split in SPLITS for lang in ("en", "fr")}


def sittings() -> list[tuple[str, str, int]]:
    """``(file stem, split, lines)`` for every sitting file of the mirror's splits, in the order of its table."""
    out = []
    for token in "".join(_SITTINGS).split():
        name, _, split = token.partition("/")
        number, lines = name.split(":")
        session, _, sitting = number.partition(".")
        out.append((f"hansard.36.{session}.house.debates.{sitting}", split or "train", int(lines)))
    return out


def members(path: str) -> list[tuple[str, int]]:
    """The archive members the file with layout path ``path`` is made of, in order, with their expected lines."""
    if path not in LAYOUT:
        raise ValueError(f"{path} is not a Hansards split file; known: {', '.join(LAYOUT)}")
    split, side = LAYOUT[path]
    return [(f"{MEMBER_DIR}{stem}.{side}.gz", lines) for stem, s, lines in sittings() if s == split]


def convert(path: str, extracted: dict, f, origin: str) -> None:
    """Write the file ``path`` to the binary file ``f`` from its sittings' members (``extracted``: member -> file).

    Each member is gunzipped, decoded from ISO-8859-1 and split at ``\\n``; each line loses the white space around
    it (none is left in the mirror; the Hugging Face loader strips too) and is written as UTF-8 with ``\\n``. The
    whole is gzip-compressed (level 9, no time stamp, the name inside as in the mirror) when ``path`` ends in
    ``.gz``. A member with other than its expected number of lines is an InputError naming it.
    """
    out = gzip.GzipFile(filename=posixpath.basename(path), mode="wb", fileobj=f, mtime=0, compresslevel=9) \
        if path.endswith(".gz") else f
    try:
        for member, expected in members(path):
            try:
                data = gzip.decompress(Path(extracted[member]).read_bytes())
            except (OSError, EOFError, zlib.error) as e:
                raise InputError(f"cannot decompress: {e}", f"{origin} ({member})") from None
            lines = data.split(b"\n")
            if lines[-1] == b"":
                lines.pop()
            if len(lines) != expected:
                raise InputError(f"has {len(lines):,} lines, the sittings table of {path} expects {expected:,}: not "
                                 "the file the mirror's split was made from (a copy of the shared data, $NMTKIT_DATA "
                                 "or $NMTKIT_MIRROR_URL, has the reference files)", f"{origin} ({member})")
            out.write("".join(line.decode(ENCODING).strip() + "\n" for line in lines).encode("utf-8"))
    finally:
        if out is not f:
            out.close()
