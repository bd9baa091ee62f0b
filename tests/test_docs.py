"""README and docs: the product's voice, links that resolve, the headline tables recomputed from the archive,
and the core example that runs as written."""

import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.staleness.run_study import load_results, step_mean
from benchmarks.staleness.pipeline_report import load_runs
from benchmarks.staleness.targets import headline, pipeline_headline, pipeline_table, table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "evidence").glob("*.md"))
# what a product page never says: how and when it was built, or files users do not have
# ("session" alone stays allowed: a process session, as in os.setsid)
NARRATION = re.compile(r"\b((first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|that|earlier|later|"
                       r"previous|next|same|each|one|two|another|morning|evening|review) sessions?|sessions? \d|"
                       r"issues? #?\d+|seen once|fresh clone of)\b", re.IGNORECASE)
# an upper-case markdown file a page cites (README.md, CHANGELOG.md, ...) must be one this repository holds
CITED_FILE = re.compile(r"\b([A-Z][A-Z_]{2,}\.md)\b")
PRODUCT_FILES = [README, ROOT / "CHANGELOG.md", *DOCS,
                 *(p for d in ("recipe", "shells", "benchmarks") for p in (ROOT / d).rglob("*")
                   if p.suffix in (".py", ".sh", ".yaml", ".md") and p.is_file())]


def test_no_page_or_module_narrates_development():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in PRODUCT_FILES
             for i, line in enumerate(p.read_text().splitlines(), 1) if NARRATION.search(line)]
    assert not found, "\n".join(found)


def test_every_cited_markdown_file_exists():
    held = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts and ".git" not in p.parts}
    missing = [f"{p.relative_to(ROOT)}: {name}" for p in PRODUCT_FILES for name in CITED_FILE.findall(p.read_text())
               if name not in held]
    assert not missing, "\n".join(missing)


def test_the_check_finds_narration():
    assert NARRATION.search("measured in the ninth session")
    assert CITED_FILE.findall("see PLAN.md section 3 and README.md") == ["PLAN.md", "README.md"]
    assert NARRATION.search("fixed in issue 15") and not NARRATION.search("the group-replay preset's issue")
    assert not NARRATION.search("the program runs in a new session") and NARRATION.search("sessions 1-8")


@pytest.mark.parametrize("page", [README, *DOCS, ROOT / "CHANGELOG.md"], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if not re.match(r"[a-z]+://", target):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_readme_shape():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    first = "\n".join(lines[:60])
    assert re.search(r"^\| 4 \| \w+ - decoupled \|", first, re.M) and "95%" in first  # the held-out headline, first screen
    assert "make demo" in README.read_text() and "make test" in README.read_text()
    assert len((ROOT / "docs" / "evidence.md").read_text().splitlines()) <= 400


def test_docs_stay_readable_in_an_afternoon():
    """All Markdown under docs/, the archives' pages included, within 2,500 lines: generated reports are printed by
    their commands, not stored beside the tables that quote them."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    lines = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in pages}
    assert sum(lines.values()) <= 2500, sorted(lines.items(), key=lambda kv: -kv[1])[:8]


def test_headline_tables_are_the_archives():
    """The archived headline rows in docs/evidence/before_protocol.md are what targets.py computes from the archived
    runs."""
    rows = table(headline(load_results(ROOT / "docs" / "evidence" / "scarce" / "results.jsonl")))
    body = [line for line in rows.splitlines()[2:]]
    # the headline's cells hold 12 paired seeds: the preset against decoupled PPO at s = 1, 4 and 8, gates_only at 4
    for cell in ("| 1 | decoupled | 12 |", "| 4 | decoupled | 12 |", "| 8 | decoupled | 12 |", "| 4 | gates_only | 12 |"):
        assert any(line.startswith(cell) for line in body), (cell, rows)
    evidence = (ROOT / "docs" / "evidence" / "before_protocol.md").read_text()
    for line in body:
        assert line in evidence, line
    pipe = pipeline_table(pipeline_headline(load_runs(ROOT / "docs" / "evidence" / "pipeline_scarce" / "results.jsonl.gz")))
    against_decoupled = [line for line in pipe.splitlines()[2:] if "| decoupled |" in line]
    assert len(against_decoupled) == 3  # one-step-off, fully-async, V1 colocate_async
    for line in against_decoupled:
        assert line in evidence, line


def test_the_development_table_is_the_archive():
    """docs/evidence.md's development block is what `protocol choose` reports from the archived development runs."""
    from benchmarks.staleness.protocol import development_report
    from benchmarks.staleness.run_study import load_results

    text = (ROOT / "docs" / "evidence.md").read_text()
    block = text.split("<!-- development -->\n", 1)[1].split("\n<!-- /development -->", 1)[0]
    runs = load_results(ROOT / "docs" / "evidence" / "protocol" / "scarce" / "dev" / "results.jsonl")
    assert block.strip() == development_report(runs).strip()


def test_the_heldout_block_is_the_archive():
    """The archive holds all 156 held-out runs (12 seeds x 13); docs/evidence.md's held-out block is the report
    (`protocol headline`) they give for the preset and alternative the development runs chose; README shows its four
    headline comparisons."""
    from benchmarks.staleness.protocol import (DARL_CANDIDATES, HELDOUT_SEEDS, SIMPLE_CANDIDATES, choose,
                                               heldout_report)
    from benchmarks.staleness.run_study import load_results

    archive = ROOT / "docs" / "evidence" / "protocol" / "scarce"
    runs = load_results(archive / "heldout" / "results.jsonl")
    assert len(runs) == 13 * len(HELDOUT_SEEDS) and {r["seed"] for r in runs} == set(HELDOUT_SEEDS), len(runs)
    text = (ROOT / "docs" / "evidence.md").read_text()
    dev = load_results(archive / "dev" / "results.jsonl")
    report = heldout_report(runs, choose(dev, DARL_CANDIDATES), choose(dev, SIMPLE_CANDIDATES))
    block = text.split("<!-- heldout -->\n", 1)[1].split("\n<!-- /heldout -->", 1)[0]
    assert block.strip() == report.strip()
    family = [line for line in report.splitlines()[2:6]]
    assert len(family) == 4 and all(line in README.read_text() for line in family)


def test_the_pipeline_block_is_the_archive():
    """The pipeline stage's archive holds every held-out seed's seven launches, finished; docs/evidence.md's pipeline
    block is the report (`protocol pipeline`) they give for the preset and alternative the development runs chose,
    every pair side by side; README shows its four Holm-adjusted comparisons."""
    from benchmarks.staleness.pipeline_report import load_runs
    from benchmarks.staleness.protocol import (DARL_CANDIDATES, HELDOUT_SEEDS, SIMPLE_CANDIDATES, choose,
                                               pipeline_launches, pipeline_stage_report, whole_seeds)
    from benchmarks.staleness.run_study import load_results

    archive = ROOT / "docs" / "evidence" / "protocol" / "scarce"
    dev = load_results(archive / "dev" / "results.jsonl")
    preset, alternative = choose(dev, DARL_CANDIDATES), choose(dev, SIMPLE_CANDIDATES)
    runs = load_runs(archive / "pipeline" / "results.jsonl.gz")
    assert whole_seeds(runs, preset, alternative) == list(HELDOUT_SEEDS)
    assert len(runs) == len(pipeline_launches(preset, alternative)) * len(HELDOUT_SEEDS)
    report = pipeline_stage_report(runs, preset, alternative)
    text = (ROOT / "docs" / "evidence.md").read_text()
    block = text.split("<!-- pipeline -->\n", 1)[1].split("\n<!-- /pipeline -->", 1)[0]
    assert block.strip() == report.strip()
    family = report.splitlines()[2:6]
    assert len(family) == 4 and all("| 12 (12) |" in line for line in family)
    assert all(line in README.read_text() for line in family)


@pytest.mark.parametrize("tag, testbed", [("validation", "scarce"), ("chains_validation", "chains")])
def test_the_validation_table_is_the_archive(tag, testbed):
    """docs/evidence.md's validation blocks, one a testbed, are what benchmarks/staleness/validation.py computes from
    the archived runs."""
    from benchmarks.staleness.validation import report

    text = (ROOT / "docs" / "evidence.md").read_text()
    block = text.split(f"<!-- {tag} -->\n", 1)[1].split(f"\n<!-- /{tag} -->", 1)[0]
    assert block.strip() == report(ROOT / "docs" / "evidence" / "protocol" / "validation" / testbed).strip()


def test_the_two_testbeds_mismatch_is_the_archive():
    """The chains section's mismatch figures (decoupled PPO at s = 4 and 8 at each testbed's validated rate: mean
    per-step chi-square and ESS fraction over seeds) are what the archived validation runs hold."""
    def means(folder: str, key: str) -> list[float]:
        runs = load_results(ROOT / "docs/evidence/protocol/validation" / folder / "results.jsonl.gz")
        return [statistics.fmean(step_mean(r, key) for r in runs
                                 if r["method_name"] == "decoupled" and r["staleness"] == s) for s in (4, 8)]

    chi_c, chi_s = means("chains/lr3e-05", "chi2_trained"), means("scarce/lr0.0002", "chi2_trained")
    ess_c, ess_s = means("chains/lr3e-05", "ess_fraction"), means("scarce/lr0.0002", "ess_fraction")
    text = " ".join((ROOT / "docs" / "evidence.md").read_text().split())
    assert (f"is {chi_c[0]:.3f} and {chi_c[1]:.3f} (s = 4, 8), against {chi_s[0]:.1f} and {chi_s[1]:.1f} on sums; "
            f"the effective sample size fraction is {ess_c[0]:.3f} and {ess_c[1]:.3f}, against {ess_s[0]:.3f} and "
            f"{ess_s[1]:.3f}") in text


def test_the_metric_ranges_are_the_logs():
    """troubleshooting.md's command runs on the archived logs, and its demo and pipeline columns quote what it
    computes (p5-p95)."""
    page = (ROOT / "docs/troubleshooting.md").read_text()
    cmd = re.search(r"`python (benchmarks/metric_ranges.py [^`]*)`", " ".join(page.split()))
    out = subprocess.run([sys.executable, *cmd.group(1).split()], capture_output=True, text=True, timeout=120,
                         check=True, cwd=ROOT).stdout
    assert "| `actor/grad_norm` |" in out
    from benchmarks.metric_ranges import ranges, sources

    (demo,) = sources(ROOT / "docs/evidence/demo/results.jsonl.gz").values()
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in page.splitlines() if line.startswith("| `")}
    for metric, fmt in (("actor/grad_norm", ".2f"), ("replay/staleness_mean", ".3g")):
        got = ranges(demo)[metric]
        assert rows[metric][2] == f"{got['p5']:{fmt}}-{got['p95']:{fmt}}", metric
    pipeline = sources(ROOT / "docs/evidence/pipeline_scarce/results.jsonl.gz").values()
    grads = [ranges(records)["actor/grad_norm"] for records in pipeline]
    assert rows["actor/grad_norm"][3] == f"{min(g['p5'] for g in grads):.2f}-{max(g['p95'] for g in grads):.2f}"


def test_core_example_runs_as_written():
    """docs/algorithm.md's one-step example selects the fresh groups first, then the least reused."""
    (code,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "algorithm.md").read_text(), re.S)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=ROOT).stdout
    # fresh groups 0 and 1 first, then the least reused of the replayed groups 2 (reused once) and 3 (never)
    assert out.startswith("selected groups [0, 1, 3]")
    assert "sources [1, 3]" in out


def test_changelog_is_dated():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.findall(r"^## \d{4}-\d{2}-\d{2}$", text, re.M)


def test_the_progress_table_is_the_archive():
    """docs/evidence.md's table of the studies under way is what benchmarks/staleness/progress.py counts in the archive."""
    from benchmarks.staleness.progress import table

    text = (ROOT / "docs" / "evidence.md").read_text()
    block = text.split("<!-- progress -->\n", 1)[1].split("<!-- /progress -->", 1)[0]
    assert block == table(ROOT / "docs" / "evidence" / "protocol")
