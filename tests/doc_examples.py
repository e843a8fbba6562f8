"""Code blocks that documents mark for tests to run: a fenced block right after an HTML comment
`<!-- first-pair: client example -->` (invisible when the Markdown is rendered)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_PAIR = ROOT / "docs" / "first-pair.md"
CLIENT_MARK = "<!-- first-pair: client example -->"
# The environment variables the example reads; docs/first-pair.md tells the user to export each.
CLIENT_ENV = ("SPARKFLEET_API_URL", "SPARKFLEET_MODEL", "SPARKFLEET_API_KEY_FILE", "SPARKFLEET_CA_FILE")


def marked_block(path: Path, mark: str, language: str) -> str:
    """The code of the one ```<language> block that follows `mark` (blank lines between allowed)."""
    text = path.read_text()
    found = re.findall(re.escape(mark) + r"\s*\n```" + re.escape(language) + r"\n(.*?)^```", text, re.M | re.S)
    assert len(found) == 1, f"{path.name}: {len(found)} ```{language} block(s) right after {mark!r}; want exactly 1"
    return found[0]


def client_example() -> str:
    """docs/first-pair.md's OpenAI-client example, as the user copies it."""
    return marked_block(FIRST_PAIR, CLIENT_MARK, "python")
