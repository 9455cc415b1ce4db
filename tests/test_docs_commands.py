"""Every command block of docs/*.md runs against a live `segfuse serve --backend numpy` and prints
what the page shows, or is marked illustrative.

How a page writes them (in full in tests/helpers/doc_sessions.py):
- ```console: `$ command` lines, each followed by what it prints; ```bash: commands that must exit
  0; ```python: a script, compared with the block after a line `printed` when there is one;
- `<!-- not run: why -->` right before a block: illustrative (GPU-only commands such as
  `--backend cupy`, installs, clusters); `<!-- file: NAME -->`: the block is saved as NAME;
- `<!-- server 8001: SEGFUSE_TOKEN=t segfuse serve --backend numpy ... -->`: a page's extra server
  (8000 is `segfuse serve --backend numpy` unless declared); `localhost:PORT` in a block is its
  address;
- compared: JSON lines as values (key order aside), timings, `ns`, `last_inference`, `*_created`
  and object addresses masked, `...` for any text.
Each page runs in order from a scratch copy of the repository root, with servers of its own; a
failure names the page and the line of each command that printed something else, with a diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.doc_sessions import blocks, matches, normalize, run_page, unmarked_sessions
from helpers.processes import ROOT

PAGES = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_prints_what_it_shows(page):
    found = run_page(page)
    assert not found, f"{len(found)} command(s) of {page.name} print something else than the page shows " \
                      "(or mark a block `<!-- not run: why -->`):\n\n" + "\n\n".join(map(str, found))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_command_blocks_are_sessions_or_marked(page):
    assert not unmarked_sessions(page), "blocks of `$ ` commands must be ```console blocks, or be marked " \
                                        "`<!-- not run: why -->`"
    reasonless = [b.where for b in blocks(page) if b.directive == "no-ci" or
                  b.directive.startswith("not run") and not b.directive.removeprefix("not run:").strip()]
    assert not reasonless, f"an illustrative block is marked `<!-- not run: why -->`, saying why: {reasonless}"


# ---- the runner catches what it should, and only that ------------------------------------------------
def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_wrong_output_is_reported_with_its_line(tmp_path):
    page = _page(tmp_path, "# t\n\n```console\n$ echo one\none\n\n$ echo two\nthree\n```\n")
    (found,) = run_page(page)
    assert found.where.endswith("page.md:7") and found.command == "$ echo two"
    assert "-three" in str(found) and "+two" in str(found)


def test_marked_blocks_do_not_run_and_files_are_written(tmp_path):
    page = _page(tmp_path, "<!-- not run: would fail -->\n```bash\nexit 1\n```\n\n"
                           "<!-- file: g.txt -->\n```text\nhello\n```\n\n"
                           "```console\n$ cat g.txt; false\nhello\n\n$ echo $?\n1\n```\n")
    assert run_page(page) == []


def test_a_python_block_is_compared_with_its_printed_block(tmp_path):
    good = "```python\nprint({'b': 1, 'a': [2]})\n```\n\nprinted\n\n```\n{'a': [2], 'b': 1}\n```\n"
    assert run_page(_page(tmp_path, good)) == []
    (found,) = run_page(_page(tmp_path, good.replace("{'a': [2], 'b': 1}", "{'a': [3], 'b': 1}")))
    assert found.where.endswith("page.md:1")


def test_a_failing_bash_block_is_reported(tmp_path):
    (found,) = run_page(_page(tmp_path, "```bash\necho hi\nfalse\n```\n"))
    assert "exit 1" in found.command


def test_what_varies_is_masked_and_nothing_else():
    shown = '{"parameters":{"timings_us":{"run":12.5,"total":30.1},"cache_hits":1},"model_name":"m"}'
    assert matches(shown, '{"model_name":"m","parameters":{"cache_hits":1,"timings_us":{"run":9,"total":40}}}')
    assert not matches(shown, '{"model_name":"m","parameters":{"cache_hits":0,"timings_us":{"run":9,"total":40}}}')
    assert not matches(shown, '{"model_name":"m","parameters":{"cache_hits":1,"timings_us":{"run":9}}}')
    assert matches("a_created 1.79e+09\nb_total 3.0", "a_created 1.80e+09\nb_total 3.0")
    assert not matches("b_total 3.0", "b_total 4.0")
    assert matches("kernel ['sf_k_...'] ... chars", "kernel ['sf_k_ee9d_0'] 21824 chars")
    assert matches("first\n...\nlast", "first\nx\ny\nlast") and not matches("first\n...\nlast", "first\nx")
    assert normalize("at localhost:41234\n\n", {41234: 8000}) == "at 127.0.0.1:8000"
