"""The web page's markdown renderer (tokenmill/entrypoints/web/static/markdown.js), run by node: model text
stays text (it is escaped before any rule runs, so no tag or attribute of its own survives), and the
markdown it promises renders. Every output, including a few thousand random ones, is parsed and held to
the renderer's tag and attribute allowlist. Skipped where node is not installed."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed: the renderer's unit test needs it")

# require()s the renderer and renders every string in the JSON array on stdin
HARNESS = """
const { renderMarkdown } = require(process.argv[1]);
const inputs = JSON.parse(require("fs").readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(inputs.map(renderMarkdown)));
"""

TAGS = {"p", "br", "strong", "em", "del", "code", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li",
        "blockquote", "hr", "table", "thead", "tbody", "tr", "th", "td", "a"}
SAFE_HREF = re.compile(r"^(https?://|mailto:|\.{0,2}/|#)", re.I)


def render(texts: list[str]) -> list[str]:
    assert NODE is not None
    script = Path(str(resources.files("tokenmill.entrypoints.web") / "static" / "markdown.js"))
    done = subprocess.run([NODE, "-e", HARNESS, str(script)], input=json.dumps(texts), capture_output=True,
                          text=True, timeout=60, check=True)
    out = json.loads(done.stdout)
    assert isinstance(out, list) and len(out) == len(texts)
    return out


class _Checker(HTMLParser):
    """Collects every violation of the allowlist: a tag, an attribute, or a value the renderer never makes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TAGS:
            self.problems.append(f"tag <{tag}>")
        for name, value in attrs:
            value = value or ""
            is_ok = ((tag, name) == ("code", "class") and re.fullmatch(r"language-[\w+#.-]+", value)
                     or (tag, name) == ("ol", "start") and value.isdigit()
                     or tag in ("th", "td") and name == "align" and value in ("left", "center", "right")
                     or tag == "a" and (name == "href" and SAFE_HREF.match(value)
                                        or (name, value) in (("target", "_blank"), ("rel", "noopener noreferrer"))))
            if not is_ok:
                self.problems.append(f"<{tag} {name}={value!r}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def handle_comment(self, data: str) -> None:
        self.problems.append(f"comment {data!r}")

    def handle_decl(self, decl: str) -> None:
        self.problems.append(f"declaration {decl!r}")

    def handle_pi(self, data: str) -> None:
        self.problems.append(f"processing instruction {data!r}")


def check(html: str) -> str:
    """The visible text of `html`, after asserting it holds only the renderer's own markup."""
    checker = _Checker()
    checker.feed(html)
    checker.close()
    assert not checker.problems, (checker.problems, html)
    return "".join(checker.text)


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "```\n</code></pre><script>alert(1)</script>\n```",
    '```"><script>alert(1)</script>\nx\n```',
    "`<iframe src=//evil>`",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:void0)",
    "[click](vbscript:msgbox)",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[click](data:text/html,<script>alert(1)</script>)",
    '[x](https://a.example/"onmouseover="alert(1))',
    "[x](https://a.example/'onmouseover='alert(1)')",
    '**<b onclick="x()">bold</b>**',
    "# <svg/onload=alert(1)>",
    "> <style>body{display:none}</style>",
    "| <a href=x> | b |\n|---|---|\n| <script> | d |",
    "- <li onclick=x>item\n- [y](#\"><script>)",
    "&lt;already escaped&gt; & <!-- comment --> <![CDATA[x]]> <?pi?>",
    "\u0000<script>\u00000\u0000",
]


def test_model_text_stays_text() -> None:
    for text, html in zip(HOSTILE, render(HOSTILE)):
        visible = check(html)
        assert "<script" not in html and "<img" not in html and "<iframe" not in html, html
        if text.startswith("<script>") or text.startswith("```\n"):  # shown as the text it is, not dropped
            assert visible == text.strip("`\n"), (text, html)
    # a link with a safe URL keeps its quotes inside the attribute value
    html = render(['[x](https://a.example/"onmouseover="y)'])[0]
    assert "onmouseover" not in re.sub(r'href="[^"]*"', "", html)


def test_random_text_never_makes_markup() -> None:
    rng = random.Random(14)
    alphabet = list("<>&\"'`*_~#-+|[]()!:;/=\\ \n\n\t.1a") + ["javascript:", "https://", "<script>", "```", "**",
                                                          "onerror=", "\u0000", "&amp;", "- ", "1. ", "> "]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 120))) for _ in range(3000)]
    for html in render(texts):
        check(html)


def test_the_markdown_it_promises() -> None:
    cases = {
        "Hello **world**, *this* and _that_, ~~gone~~ and `x < y`": (
            "<p>Hello <strong>world</strong>, <em>this</em> and <em>that</em>, <del>gone</del> and "
            "<code>x &lt; y</code></p>"),
        "```python\nif a < b:\n    print(\"**not bold**\")\n```\nafter": (
            '<pre><code class="language-python">if a &lt; b:\n    print(&quot;**not bold**&quot;)</code></pre>'
            "<p>after</p>"),
        "```js\nstill streaming": '<pre><code class="language-js">still streaming</code></pre>',
        "# One\n### Three": "<h1>One</h1><h3>Three</h3>",
        "- a\n- b\n  - c\n\n3. x\n4. y": "<ul><li>a</li><li>b<ul><li>c</li></ul></li></ul><ol start=\"3\"><li>x</li><li>y</li></ol>",
        "1. one\n\n2. two": "<ol><li>one</li><li>two</li></ol>",
        "> quoted\n\nline one\nline two": "<blockquote><p>quoted</p></blockquote><p>line one<br>line two</p>",
        "| a | b |\n|:--|--:|\n| 1 | 2 |": ('<table><thead><tr><th align="left">a</th><th align="right">b</th></tr></thead>'
                                           '<tbody><tr><td align="left">1</td><td align="right">2</td></tr></tbody></table>'),
        "see [docs](https://example.org/a_b_c) now": (
            '<p>see <a href="https://example.org/a_b_c" target="_blank" rel="noopener noreferrer">docs</a> now</p>'),
        "snake_case_name and 2 * 3 * 4": "<p>snake_case_name and 2 * 3 * 4</p>",
        "---": "<hr>",
    }
    for (text, expected), html in zip(cases.items(), render(list(cases))):
        assert html == expected, text
        check(html)
