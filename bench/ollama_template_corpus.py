"""How many of Ollama's own templates greenroom renders exactly as Ollama does: every
`template/*.gotmpl` of an ollama/ollama checkout, rendered (http/ollama/ollama_templates.py) on the
conversations of Ollama's TestTemplate (template/template_test.go) and compared with the
outputs Ollama's tests expect (`template/testdata/<name>.gotmpl/<case>`), byte for byte.

The cases are Ollama's: `user`, `user-assistant-user` and `system-user-assistant-user`, one
trailing space dropped for the templates its test drops it for; and, where a template has
them, `tools-single` (a get_weather tool, no message), `tools-single-call` (an assistant's
call of it) and `tools-single-result` (a tool's result) — their inputs read back from the
expected outputs, since the test that feeds them is not in the folder.

    .venv/bin/python bench/ollama_template_corpus.py /path/to/ollama [--show-diffs]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from greenroom.http.ollama import go_template, ollama_templates  # noqa: E402

USER = {"role": "user", "content": "Hello, how are you?"}
ASSISTANT = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
USER2 = {"role": "user", "content": "I'd like to show off how chat templating works!"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current weather information for a location",
        "parameters": {
            "type": "object",
            "required": ["location"],
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {
                    "type": "string",
                    "description": "The unit of temperature to use",
                    "enum": ["celsius", "fahrenheit"],
                },
            },
        },
    },
}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"location": "San Francisco, CA"}}}],
}
RESULT = {"role": "tool", "content": '{"temperature": 22, "condition": "Sunny", "humidity": 45, "wind_speed": 10}'}
CASES = {
    "user": ([USER], None),
    "user-assistant-user": ([USER, ASSISTANT, USER2], None),
    "system-user-assistant-user": ([SYSTEM, USER, ASSISTANT, USER2], None),
    "tools-single": ([], [TOOL]),
    "tools-single-call": ([CALL], None),
    "tools-single-result": ([RESULT], None),
}
# the templates whose rendering Ollama's test compares without its last space
TRAILING_SPACE = {"chatqa.gotmpl", "llama2-chat.gotmpl", "mistral-instruct.gotmpl", "openchat.gotmpl", "vicuna.gotmpl"}


def judge(path: Path) -> tuple[str, list[str]]:
    """("identical" | "differs" | "refused" | "no test data", what differs)."""
    testdata = path.parent / "testdata" / path.name
    cases = sorted(p.name for p in testdata.iterdir() if p.name in CASES) if testdata.is_dir() else []
    if not cases:
        return "no test data", []
    text = path.read_text().replace("\r\n", "\n")  # as Ollama reads its templates
    faults = []
    for case in cases:
        messages, tools = CASES[case]
        try:
            got = ollama_templates.execute(text, messages, tools)
        except go_template.TemplateError as exc:
            return "refused" if exc.construct else "differs", [f"{case}: {exc}"]
        if path.name in TRAILING_SPACE and got.endswith(" "):
            got = got[:-1]
        want = (testdata / case).read_text()
        if got != want:
            faults.append(f"{case}:\n  got  {got!r}\n  want {want!r}")
    return ("differs" if faults else "identical"), faults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ollama", type=Path, help="an ollama/ollama checkout")
    parser.add_argument("--show-diffs", action="store_true")
    args = parser.parse_args()
    verdicts = {p.name: judge(p) for p in sorted((args.ollama / "template").glob("*.gotmpl"))}
    for name, (verdict, faults) in verdicts.items():
        print(f"{verdict:13} {name}")
        for fault in faults if args.show_diffs else []:
            print("   ", fault)
    tested = [v for v, _ in verdicts.values() if v != "no test data"]
    print(
        f"{tested.count('identical')} of {len(tested)} templates with test data render identically "
        f"({tested.count('refused')} refused, {tested.count('differs')} differ); "
        f"{len(verdicts) - len(tested)} have none"
    )


if __name__ == "__main__":
    main()
