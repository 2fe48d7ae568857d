"""The example recipes: shell syntax, the commands --dry-run prints, and a tiny end-to-end run of the CPU-scale one."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "examples" / "wmt14-en-fr" / "run.sh"
CPU = REPO / "examples" / "cpu-scale" / "run.sh"


SETTINGS = ("SUBSET", "NEWS_OLDER", "DEV_SAMPLE", "TEST_LINES", "VOCAB", "TRAIN_MINUTES", "UPDATES", "CALIB_UPDATES",
            "VALIDATIONS", "SIDE_BY_SIDE", "THREADS", "BEAM", "BOOTSTRAP", "SEED", "RESULTS", "IN_DOMAIN",
            "SELECT_WORDS", "MODELS", "TRAIN_HOURS", "STAR_HOURS", "PATIENCE", "VALID_EVERY", "DEVICE", "BF16",
            "WORKERS", "STAR_FACTOR", "DECODE", "GUIDE_UPDATES", "GUIDE_WEIGHT")


def clean_env(**extra) -> dict:
    """The environment with the recipes' settings at their defaults."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    return {**env, "PYTHON": "python3", **extra}


def commands(script: Path, *args: str, work: Path) -> list[list[str]]:
    """The commands a recipe prints with --dry-run, split into words; and nothing is created."""
    out = subprocess.run(["bash", str(script), "--dry-run", *args], capture_output=True, text=True, timeout=60,
                         env=clean_env(WORK=str(work)))
    assert out.returncode == 0, out.stderr
    assert not work.exists(), "--dry-run must not create anything"
    cmds = []
    for line in out.stdout.splitlines():
        if line.startswith("+ "):
            cmd = line[2:].split(" > ")[0]  # run_to's redirection
            cmds.append(shlex.split(cmd))
    return cmds


def tool(cmds: list[list[str]], name: str) -> list[list[str]]:
    return [c for c in cmds if c and c[0] == name]


def value(cmd: list[str], option: str) -> str:
    return cmd[cmd.index(option) + 1]


@pytest.mark.parametrize("script", [PAPER, CPU], ids=["wmt14-en-fr", "cpu-scale"])
def test_scripts_parse_and_document_themselves(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert os.access(script, os.X_OK)
    help_ = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert help_.returncode == 0 and "--stage" in help_.stdout and "--dry-run" in help_.stdout
    bad = subprocess.run(["bash", str(script), "--stage", "nope", "--dry-run"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "unknown stage 'nope'" in bad.stderr
    assert (script.parent / "README.md").is_file()


def test_paper_protocol_dry_run(tmp_path):
    cmds = commands(PAPER, work=tmp_path / "w")
    fetch = [c for c in cmds if c[1:3] == ["-m", "nmtkit.datasets"]]
    assert len(fetch) == 1 and {"europarl-v7", "un", "giga-fren", "commoncrawl", "news-commentary-v9",
                                "newstest2014"} <= set(fetch[0])

    (select,) = tool(cmds, "nmt-select")
    assert select[1:7] == ["--source-lang", "en", "--target-lang", "fr", "--in-domain", value(select, "--in-domain")]
    assert value(select, "--top-words") == "348000000" and select.count("--general") == 5
    assert "-o" in select

    (prepare,) = tool(cmds, "nmt-prepare")
    assert value(prepare, "--src-vocab-size") == value(prepare, "--tgt-vocab-size") == "30000"
    assert value(prepare, "--max-len") == "50" and value(prepare, "--train") == value(select, "-o")
    assert value(prepare, "--valid").endswith("newstest2012-2013")

    trains = tool(cmds, "nmt-train")
    fresh = {(value(c, "--arch"), value(c, "--max-len")) for c in trains if "--resume" not in c}
    assert fresh == {("rnnencdec-30", "30"), ("rnnsearch-30", "30"), ("rnnencdec-50", "50"), ("rnnsearch-50", "50")}
    (star,) = [c for c in trains if "--resume" in c]  # RNNsearch-50*: on until the development set stops improving
    assert value(star, "--arch") == "rnnsearch-50" and "--patience" in star and value(star, "--max-len") == "50"

    translates = tool(cmds, "nmt-translate")
    assert len(translates) == 10 and all(value(c, "--beam") == "12" for c in translates)
    assert sum("--no-unk" in c for c in translates) == 5
    assert any("rnnsearch-50star/checkpoint_best.pt" in value(c, "--model") for c in translates)

    scores = tool(cmds, "nmt-score")
    table1 = [c for c in scores if "--model" in c]
    assert len(table1) == 2 and all(len([w for w in c if w.endswith(".fr")]) == 6 for c in table1)  # ref + 5
    (figure2,) = [c for c in scores if "--by-length" in c]
    assert "--plot" in figure2 and figure2.count("-n") == 4

    (align,) = tool(cmds, "nmt-align")
    assert "--plot-dir" in align and "rnnsearch-50/" in value(align, "-m")


def test_cpu_scale_dry_run(tmp_path):
    cmds = commands(CPU, work=tmp_path / "w")
    samples = [c for c in cmds if c[1:3] == [str(REPO / "examples" / "steps.py"), "sample"]]
    assert "--shuffle" in samples[0] and samples[0][-1].endswith("hansards/train=300000")

    prepares = tool(cmds, "nmt-prepare")
    prepare = prepares[0]
    assert value(prepare, "--max-len") == "50" and value(prepare, "--src-vocab-size") == "30000"
    assert prepare.count("--train") == 7 and prepare.count("--test") == 2
  # both directions, the French->English one for the symmetrised alignments
    assert [(value(c, "--source-lang"), value(c, "--target-lang")) for c in prepares] == [("en", "fr"), ("fr", "en")]
    assert value(prepares[1], "--train") == value(prepare, "--train") and "--test" not in prepares[1]

    trains = [c for c in tool(cmds, "nmt-train") if "--guided-alignment" not in c]
    # calibration (thrown away), the six trainings, stage twin's
    calibration, final, (twin,) = trains[:4], trains[4:-1], trains[-1:]
    assert all("/calibration/" in value(c, "--save-dir") for c in calibration)
    assert {(value(c, "--arch"), value(c, "--max-len")) for c in calibration} == {
        ("rnnsearch-small", "50"), ("rnnencdec-small", "50"), ("rnnsearch-small", "30"), ("rnnencdec-small", "30")}
    (budget,) = [c for c in cmds if c[2:3] == ["budget"]]
    assert value(budget, "--slots") == "2" and value(budget, "--minutes") == "240"
    assert any(j.startswith("rnnsearch-50star=") and j.endswith("*2.3") for j in budget)
    runs = {value(c, "--save-dir").rsplit("/", 1)[1]: c for c in final}
    assert sorted(runs) == sorted(["rnnencdec-30", "rnnsearch-30", "rnnencdec-50", "rnnsearch-50", "rnnsearch-50star",
                                   "rnnsearch-50-fr-en"])
    for name, c in runs.items():
        assert value(c, "--arch") == ("rnnencdec-small" if "encdec" in name else "rnnsearch-small")
        assert value(c, "--max-len") == ("30" if name.endswith("-30") else "50")
        assert value(c, "--recipe") == "budget" and value(c, "--threads") == "1"
        assert value(c, "--max-updates") == "$(U)"  # (the plan: known once the calibration has run)
        assert c[1].endswith("data-bin-fr-en" if name.endswith("fr-en") else "data-bin")
    # stage twin: RNNsearch-50*'s French->English twin, as long (its planned updates), alone on both threads
    assert value(twin, "--save-dir").endswith("/runs/rnnsearch-50star-fr-en") and twin[1].endswith("data-bin-fr-en")
    assert value(twin, "--max-updates") == "$(U*)" and value(twin, "--threads") == "2"
    same = {"$(U)": "$(U*)", "$(EVERY)": "$(EVERY*)"}  # otherwise trained as the first twin
    expected = [same.get(a, a.replace("/rnnsearch-50-fr-en", "/rnnsearch-50star-fr-en"))
                for a in runs["rnnsearch-50-fr-en"]]
    expected[expected.index("--threads") + 1] = "2"
    assert twin == expected

    # stage guide: eflomal's links of the training pairs, and RNNsearch-50 and the French->English model trained on
    # towards them (for the alignment section only)
    (links,) = [c for c in cmds if c[1:2] == [str(REPO / "examples" / "guide_links.py")]]
    assert links[2].endswith("/data-bin") and value(links, "-o").endswith("/data-bin/train.align")
    guided = {value(c, "--save-dir").rsplit("/", 1)[1]: c for c in tool(cmds, "nmt-train") if "--guided-alignment" in c}
    assert sorted(guided) == ["rnnsearch-50-fr-en-guided", "rnnsearch-50-guided", "rnnsearch-50star-fr-en-guided",
                              "rnnsearch-50star-guided"]
    for name, c in guided.items():
        start = name.removesuffix("-guided")
        assert value(c, "--init-from").endswith(f"/runs/{start}/checkpoint_last.pt")
        assert c[1] == (twin[1] if start == "rnnsearch-50star-fr-en" else runs[start][1])
        assert value(c, "--guided-alignment") == value(links, "-o") and value(c, "--max-updates") == "300"
        assert value(c, "--guided-alignment-order") == ("tgt-src" if "fr-en" in name else "src-tgt")

    translates = tool(cmds, "nmt-translate")
    assert len(translates) == 15 and all(value(c, "--beam") == "12" for c in translates)
    assert [value(c, "-i").endswith("newstest2014-nounk.en") for c in translates if "--no-unk" in c] == [True] * 5
    assert {value(c, "-m").split("/")[-2] for c in translates} == set(runs) - {"rnnsearch-50-fr-en"}

    scores = tool(cmds, "nmt-score")
    (table1,) = [c for c in scores if "--model" in c and "--bootstrap" in c]
    assert table1.count("-n") == 6 and value(table1, "-n") == "RNNencdec-30"  # five models, Moses; the baseline first
    figure2 = [c for c in scores if "--by-length" in c and "--plot" in c]
    assert len(figure2) == 2 and all(c.count("-n") == 4 for c in figure2)  # the paper's four curves

    aligns = tool(cmds, "nmt-align")
    gold = [c for c in aligns if "--gold" in c]
    assert gold and all("--tokenized" in c and value(c, "--gold-order") == "tgt-src"
                        and value(c, "--gold").endswith("hansards-trial/trial.align") for c in gold)
    (sym, sym_posterior, guided_sym_attention, guided_sym, star_sym, star_sym_posterior, star_guided_sym_attention,
     star_guided_sym) = [c for c in gold if "--reverse-model" in c]
    for c in (sym, sym_posterior):
        assert "rnnsearch-50-fr-en/" in value(c, "--reverse-model") and "rnnsearch-50/" in value(c, "-m")
    assert "--method" not in sym and value(sym_posterior, "--method") == "posterior"
    for c in (guided_sym_attention, guided_sym):
        assert "rnnsearch-50-fr-en-guided/" in value(c, "--reverse-model") and "rnnsearch-50-guided/" in value(c, "-m")
    assert "--method" not in guided_sym_attention and value(guided_sym, "--method") == "posterior"
    for c in (star_sym, star_sym_posterior):
        assert "rnnsearch-50star-fr-en/" in value(c, "--reverse-model") and "rnnsearch-50star/" in value(c, "-m")
    assert "--method" not in star_sym and value(star_sym_posterior, "--method") == "posterior"
    for c in (star_guided_sym_attention, star_guided_sym):
        assert "rnnsearch-50star-fr-en-guided/" in value(c, "--reverse-model")
        assert "rnnsearch-50star-guided/" in value(c, "-m")
    assert "--method" not in star_guided_sym_attention and value(star_guided_sym, "--method") == "posterior"
    assert any("rnnsearch-50star/" in value(c, "-m") and "--reverse-model" not in c for c in gold)
    assert [value(c, "--method") for c in gold if "--method" in c and "--reverse-model" not in c] == ["posterior"]
    assert any("--plot-dir" in c for c in aligns)
    assert any(c[1:2] == [str(REPO / "examples" / "eflomal_aer.py")] and "--gold" in c for c in cmds)
    assert any(c[1:2] == [str(REPO / "examples" / "cpu_scale_report.py")] for c in cmds)


def test_one_stage_at_a_time(tmp_path):
    cmds = commands(CPU, "--stage", "train", work=tmp_path / "w")
    assert {c[0] for c in cmds} <= {"mkdir", "nmt-train", "python3", "wait", "rm"} and tool(cmds, "nmt-train")
    cmds = commands(PAPER, "--stage=select", work=tmp_path / "w")
    assert [c[0] for c in cmds] == ["mkdir", "nmt-select"]
    cmds = commands(CPU, "--stage", "prepare", "--tiny", work=tmp_path / "w")
    assert [c[0] for c in cmds] == ["nmt-prepare", "nmt-prepare"] and value(cmds[1], "--src-vocab-size") == "2000"


def test_cpu_scale_takes_up_the_settings_of_stages_added_since_a_run_began(tmp_path, data_dir):
    """A run begun before a stage existed goes on with that stage's settings recorded (the guide stage's, here);
    a setting it recorded, changed, is still refused."""
    work = tmp_path / "w"
    env = clean_env(WORK=str(work), NMTKIT_DATA=str(data_dir))
    first = subprocess.run(["bash", str(CPU), "--tiny", "--stage", "data"], capture_output=True, text=True,
                           timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    settings = json.loads((work / "settings.json").read_text())
    assert settings["GUIDE_UPDATES"] == "4" and settings["GUIDE_WEIGHT"] == "1.0"
    older = {k: v for k, v in settings.items() if not k.startswith("GUIDE_")}  # as a run begun earlier wrote it
    (work / "settings.json").write_text(json.dumps(older))
    again = subprocess.run(["bash", str(CPU), "--tiny", "--stage", "data"], capture_output=True, text=True,
                           timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "settings of stages added since this run began, recorded" in again.stderr
    assert json.loads((work / "settings.json").read_text()) == settings
    changed = subprocess.run(["bash", str(CPU), "--tiny", "--stage", "data"], capture_output=True, text=True,
                             timeout=300, env={**env, "GUIDE_WEIGHT": "0.5"})
    assert changed.returncode != 0 and "GUIDE_WEIGHT='0.5' (was '1.0')" in changed.stderr


@pytest.mark.slow
def test_cpu_scale_tiny_end_to_end_through_a_kill(tmp_path, data_dir):
    """The whole CPU-scale pipeline on a few hundred pairs with the tiny presets: killed (SIGTERM) while the six
    trainings run, then run again, it goes on where it stopped (the trainings resume from the checkpoints saved at
    the kill, the stages done are not run again), trains each model for its planned updates exactly, and writes the
    report with Table 1's five models, Figure 2's four curves, the symmetrised and eflomal AER and the checks."""
    work = tmp_path / "tiny"
    env = clean_env(WORK=str(work), NMTKIT_DATA=str(data_dir))
    start = time.monotonic()
    first = subprocess.Popen(["bash", str(CPU), "--tiny"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
    star_log = work / "runs" / "rnnsearch-50star" / "train.jsonl"
    while first.poll() is None and not (star_log.is_file() and '"type": "train"' in star_log.read_text()):
        time.sleep(0.2)
    assert first.poll() is None, first.stdout.read()[-3000:]
    first.send_signal(signal.SIGTERM)
    out1 = first.communicate(timeout=120)[0]
    assert first.returncode == 130, out1[-3000:]
    assert "run.sh: stopped; run it again to go on from here" in out1
    assert not (work / "done" / "train").exists() and (work / "done" / "prepare").exists()

    again = subprocess.run(["bash", str(CPU), "--tiny"], capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for stage in ("data", "prepare"):
        assert f"# === stage {stage}: done already" in again.stdout
    assert "calibration" not in again.stdout  # (the plan was made before the kill)
    plan = dict(line.split()[:2] for line in (work / "runs" / "plan.txt").read_text().splitlines())
    assert sorted(plan) == sorted(["rnnencdec-30", "rnnsearch-30", "rnnencdec-50", "rnnsearch-50", "rnnsearch-50star",
                                   "rnnsearch-50-fr-en"])
    assert int(plan["rnnsearch-50star"]) == pytest.approx(2.3 * int(plan["rnnsearch-50"]), abs=10)
    assert len({plan[m] for m in plan if m != "rnnsearch-50star"}) == 1  # the same U for the other five
    for m, updates in plan.items():
        records = [json.loads(line) for line in open(work / "runs" / m / "train.jsonl", encoding="utf-8")]
        assert max(r["update"] for r in records if "update" in r) == int(updates), m
    assert "resumed from update" in (work / "logs" / "train-rnnsearch-50star.log").read_text()
    # stage twin: RNNsearch-50*'s French->English twin, trained for the updates the plan gave RNNsearch-50*
    records = [json.loads(line) for line in open(work / "runs" / "rnnsearch-50star-fr-en" / "train.jsonl")]
    assert max(r["update"] for r in records if "update" in r) == int(plan["rnnsearch-50star"])

    results = (work / "RESULTS.md").read_text()
    for heading in ("## Table 1", "## Figure 2", "## Alignments", "## The paper's findings"):
        assert heading in results
    assert "{{" not in results and "(missing)" not in results
    assert "RNNsearch-30 beats even RNNencdec-50" in results and "RNNsearch-50star" in results
    assert len(list((work / "results").glob("*.png"))) >= 5
    aer = json.loads((work / "eval" / "aer.json").read_text())
    assert aer["sentences"] == 37 and aer["sure"] == 338 and 0 <= aer["aer"] <= 1
    from nmtkit.symmetrize import HEURISTICS, METHODS

    for name, methods in (("aer-symmetrized.json", METHODS), ("aer-eflomal.json", HEURISTICS),
                          ("aer-guided-symmetrized.json", METHODS), ("aer-symmetrized-posterior.json", METHODS),
                          ("aer-guided-symmetrized-attention.json", METHODS), ("aer-star-symmetrized.json", METHODS),
                          ("aer-star-symmetrized-posterior.json", METHODS),
                          ("aer-star-guided-symmetrized-attention.json", METHODS),
                          ("aer-star-guided-symmetrized.json", METHODS)):
        report = json.loads((work / "eval" / name).read_text())
        assert set(report["by_method"]) == {"forward", "backward", *methods} and report["sentences"] == 37, name
    report = json.loads((work / "eval" / "newstest2014.json").read_text())
    assert [s["name"] for s in report["systems"]] == ["RNNencdec-30", "RNNsearch-30", "RNNencdec-50", "RNNsearch-50",
                                                      "RNNsearch-50star", "Moses-uedin"]
    figure2 = json.loads((work / "eval" / "hansards-test-by-length.json").read_text())
    assert list(figure2["by_length"]["scores"]) == ["RNNencdec-30", "RNNsearch-30", "RNNencdec-50", "RNNsearch-50"]
    index = (work / "eval" / "alignments" / "index.tsv").read_text().splitlines()
    assert len(index) == 5 and "European Economic Area" in index[1]  # the paper's sentence, then three at random
    stages = [line.split("\t")[0] for line in (work / "timings.tsv").read_text().splitlines()]
    assert stages == ["data", "prepare", "train", "translate", "score", "twin", "guide", "align", "report"]
    # stage guide: links for every line of train.tok, and the two guided runs trained on them for their updates
    links = (work / "data-bin" / "train.align").read_text().split("\n")[:-1]
    assert len(links) == len((work / "data-bin" / "train.tok.en").read_text().splitlines())
    for m in ("rnnsearch-50-guided", "rnnsearch-50-fr-en-guided", "rnnsearch-50star-guided",
              "rnnsearch-50star-fr-en-guided"):
        records = [json.loads(line) for line in open(work / "runs" / m / "train.jsonl", encoding="utf-8")]
        assert max(r["update"] for r in records) == 4
        assert all("align_loss" in r for r in records if r["type"] == "train")
    assert "RNNsearch-50 after guided alignment" in results and "its alignment posterior" in results
    assert "the symmetrised alignment posterior of the same two models" in results
    assert "the same two after guided alignment, attention, recased: soft (chosen)" in results
    # the evidence beside the report: the JSON reports, links and the run's records, as the run wrote them
    evidence = work / "results" / "eval"
    for src in [*(work / "eval").glob("*.json"), *(work / "eval").glob("*.links"), work / "eval" / "table1.md",
                work / "settings.json", work / "runs" / "budget.json", work / "runs" / "plan.txt"]:
        assert (evidence / src.name).read_bytes() == src.read_bytes(), src.name
    timings = (work / "timings.tsv").read_text().splitlines()  # (the report's own time is recorded after it)
    assert (evidence / "timings.tsv").read_text().splitlines() == [t for t in timings if not t.startswith("report\t")]
    assert len(list(evidence.glob("aer*.json"))) == 15
    # the Discussion, written by a person after reading the numbers, survives the report being made again
    with open(work / "RESULTS.md", "a", encoding="utf-8") as f:
        f.write("\nRNNsearch aligns; a person wrote this.\n")
    # one stage again: it and the stages after it are to be done again, and the next plain run does just those;
    # the stage's time is that of its new run, not added to the old one's
    seconds = {line.split("\t")[0]: int(line.split("\t")[1]) for line in (work / "timings.tsv").read_text().split("\n")
               if line}
    assert seconds["align"] >= 2
    began = time.time()  # (bash's SECONDS, which the stage's time is, reads this wall clock: a clock
    # adjustment during the run moves both alike, where against time.monotonic a recorded 74 s met a measured 63 s)
    align = subprocess.run(["bash", str(CPU), "--tiny", "--stage", "align"], capture_output=True, text=True,
                           timeout=300, env=env)
    took = time.time() - began
    assert align.returncode == 0, align.stderr[-3000:]
    again_seconds = dict(line.split("\t") for line in (work / "timings.tsv").read_text().split("\n") if line)
    assert int(again_seconds["align"]) <= took + 1 and "report" not in again_seconds
    assert (work / "done" / "align").exists() and not (work / "done" / "report").exists()
    last = subprocess.run(["bash", str(CPU), "--tiny"], capture_output=True, text=True, timeout=120, env=env)
    assert last.returncode == 0 and last.stdout.count(": done already") == 8 and "# === stage report ===" in last.stdout
    sessions = (work / "sessions.tsv").read_text().splitlines()
    assert [line.split("\t")[2] for line in sessions] == ["all", "all", "align", "all"]
    assert [line.split("\t")[3] for line in sessions] == [
        "data prepare train", "train translate score twin guide align report", "align", "report"]
    final = (work / "RESULTS.md").read_text()
    assert "All from one commit" in final and "| all | train translate score twin guide align report |" in final
    assert final.endswith("\nRNNsearch aligns; a person wrote this.\n") and final.count("## Discussion") == 1
    assert (work / "results" / "eval" / "sessions.tsv").read_text() == (work / "sessions.tsv").read_text()
    print(f"tiny CPU-scale run, killed once: {time.monotonic() - start:.0f} s")


ONE_HOUR = REPO / "examples" / "one-hour.sh"


def test_one_hour_recipe_end_to_end_on_a_small_corpus(tmp_path, data_dir):
    """examples/one-hour.sh on 600 real Hansards pairs (gzipped, as a user may give them) with a 20-second budget:
    it holds pairs out for validation, prepares SentencePiece data, trains to the budget and leaves the annealed
    model and the options it is decoded with; nmt-translate with those options gives one line of words per input
    line. Run again, it reuses the prepared data and resumes the finished run instead of training anew; run with
    other vocabulary settings on the same work directory, it refuses."""
    import gzip
    import itertools

    for lang in ("en", "fr"):
        with gzip.open(data_dir / "hansards" / f"train.{lang}.gz", "rt", encoding="utf-8") as f, \
                gzip.open(tmp_path / f"corpus.{lang}.gz", "wt", encoding="utf-8") as out:
            out.writelines(itertools.islice(itertools.islice(f, 20000, None), 600))
    work = tmp_path / "work"
    env = {**clean_env(), "SPM_UNITS": "400", "VALID_EVERY": "20", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ONE_HOUR), str(tmp_path / "corpus"), str(work), "--seconds", "20",
                          "--threads", "1"], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "60 of 600 pairs held out for validation" in run.stderr
    manifest = json.loads((work / "data" / "manifest.json").read_text())
    assert manifest["sentencepiece"]["learned_units"] == 400
    records = [json.loads(line) for line in open(work / "model" / "train.jsonl", encoding="utf-8")]
    made = max(r["update"] for r in records)
    assert f"== done: {made} updates in 20 s of training" in run.stderr
    assert (work / "train.updates").read_text().strip() == str(made)  # (what the quick start reads)
    ckpt = work / "model" / "checkpoint_last.pt"
    from nmtkit.data import checkpoint

    payload = checkpoint.load(ckpt)
    assert payload["train"]["config"]["recipe"] == "budget" and payload["train"]["state"]["elapsed"] >= 20
    assert payload["train"]["schedule"]["budget"] == 20.0
    # PRECISION=auto: bfloat16 autocast where this CPU computes it natively, float32 where it would be emulated
    import torch

    from nmtkit.device import bf16_is_native

    native = bf16_is_native(torch.device("cpu"))
    assert payload["train"]["config"]["bf16"] is native
    assert (work / "train.precision").read_text().strip() == ("bf16" if native else "fp32")
    options = (work / "translate.options").read_text().split()
    assert "--beam" in options
    src = (work / "split.valid.en").read_text(encoding="utf-8").splitlines()  # (held out: never trained on)
    out = subprocess.run([str(REPO / "bin" / "nmt-translate"), "-m", str(ckpt), *options, "-q"],
                         input="\n".join(src[:20]) + "\n", capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    # one line out per line in, of text, not pieces (a 20-second model's words are few; the glue of pieces into one
    # word is tested on a trained model in tests/test_sentencepiece.py)
    assert len(lines) == 20 and "\u2581" not in out.stdout and "--no-repeat-ngram" in options
    assert "--source-numbers" in options and "--all-numbers" in options
    assert options[options.index("--candidates") + 1] == str(work / "data" / "candidates.npz")  # (work: absolute)
    # the same options saved in the checkpoint (the table relative to it): nmt-translate decodes with them unasked
    assert payload["decoding_defaults"] == {"beam": 6, "constrained_beam": 12, "no_repeat_ngram": 4,
                                            "source_numbers": True, "all_numbers": True,
                                            "candidates": "../data/candidates.npz"}
    unasked = subprocess.run([str(REPO / "bin" / "nmt-translate"), "-m", str(ckpt), "-q"],
                             input="\n".join(src[:20]) + "\n", capture_output=True, text=True, timeout=300,
                             env={**env, "PYTHONPATH": str(REPO)})
    assert unasked.returncode == 0 and unasked.stdout == out.stdout, unasked.stderr[-2000:]
    again = subprocess.run(["bash", str(ONE_HOUR), str(tmp_path / "corpus"), str(work), "--seconds", "20",
                            "--threads", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nmt-prepare" not in again.stderr and "already reached its --max-updates/--max-time limit" in again.stderr
    assert max(json.loads(line)["update"] for line in open(work / "model" / "train.jsonl")) == made
    # other settings on the same work dir: refused with one line naming the prepared directory, nothing trained
    other = subprocess.run(["bash", str(ONE_HOUR), str(tmp_path / "corpus"), str(work), "--seconds", "20",
                            "--threads", "1"], capture_output=True, text=True, timeout=300,
                           env={**env, "SPM_UNITS": "500"})
    assert other.returncode != 0
    assert other.stderr.strip().splitlines()[-1].startswith(f"one-hour.sh: {work / 'data' / 'manifest.json'}: "
                                                            "prepared with 400 SentencePiece units")
    assert "SPM_UNITS=500" in other.stderr
    bad = subprocess.run(["bash", str(ONE_HOUR), str(tmp_path / "corpus"), str(work)], capture_output=True,
                         text=True, timeout=60, env={**env, "PRECISION": "fp16"})
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "one-hour.sh: PRECISION must be auto, fp32 or bf16 (got 'fp16')"
    assert max(json.loads(line)["update"] for line in open(work / "model" / "train.jsonl")) == made
