"""Parses envelopes produced by this project with the official CloudEvents Python SDK.

Usage: python3 cloudevents_check.py ENVELOPES.jsonl

Each line is one envelope, CloudEvents 1.0 structured JSON, as the outbox stores it. The SDK
(`pip install cloudevents`, the `cloudevents.core` v1 API) must parse and validate every one,
and `id`, `source`, `type`, `subject`, `time`, `data` and every extension attribute must come
through unchanged. Prints one line per failure and a closing `N passed, M failed`; exits 1 on
any failure, 2 when the SDK is missing.
"""

import json
import sys

try:
    from cloudevents.core.formats.json import JSONFormat
    from dateutil.parser import isoparse
except ImportError as e:  # pragma: no cover
    print(f"cloudevents SDK not installed: {e} (pip install cloudevents)", file=sys.stderr)
    sys.exit(2)

CORE = {"id", "source", "type", "specversion", "subject", "time", "datacontenttype", "dataschema", "data"}


def check(line: str) -> list[str]:
    raw = json.loads(line)
    event = JSONFormat().read(None, line.encode("utf-8"))
    problems = []

    def same(what, got, want):
        if got != want:
            problems.append(f"{raw.get('type')} {raw.get('id')}: {what}: SDK gave {got!r}, envelope has {want!r}")

    same("specversion", event.get_specversion(), raw["specversion"])
    same("id", event.get_id(), raw["id"])
    same("source", event.get_source(), raw["source"])
    same("type", event.get_type(), raw["type"])
    same("subject", event.get_subject(), raw["subject"])
    same("datacontenttype", event.get_datacontenttype(), raw.get("datacontenttype"))
    same("time", event.get_time(), isoparse(raw["time"]))
    same("data", event.get_data(), raw["data"])
    extensions = {k: v for k, v in raw.items() if k not in CORE}
    if not extensions:
        problems.append(f"{raw.get('type')} {raw.get('id')}: no extension attributes")
    for name, value in extensions.items():
        same(f"extension {name}", event.get_extension(name), value)
    return problems


def main() -> int:
    passed = failed = 0
    types = set()
    with open(sys.argv[1], encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                problems = check(line)
            except Exception as e:  # the SDK refused it
                problems = [f"line {number}: the SDK refused the envelope: {type(e).__name__}: {e}"]
            if problems:
                failed += 1
                for p in problems:
                    print(p)
            else:
                passed += 1
                types.add(json.loads(line)["type"])
    print("types: " + ", ".join(sorted(types)))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
