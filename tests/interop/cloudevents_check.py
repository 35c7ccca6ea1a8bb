"""Parses envelopes produced by this project with the official CloudEvents Python SDK.

Usage: python3 cloudevents_check.py ENVELOPES.jsonl

Each line is one envelope, CloudEvents 1.0 structured JSON, as the outbox stores it. The SDK
(`pip install cloudevents`, the `cloudevents.core` v1 API) must parse and validate every one,
and `id`, `source`, `type`, `subject`, `time`, `data` and every extension attribute must come
through unchanged:

- as the SDK reads them (`JSONFormat().read`, the `get_*` accessors), and
- as the SDK writes the event back out (`JSONFormat().write`), read again as plain JSON.

`time` is compared as an instant, independently of the SDK's own parser: Python's `datetime`
has microseconds, so the SDK reads the envelope's nanoseconds truncated to the microsecond,
and that truncation is the only difference allowed.

Prints one line per problem, then `types: …` (the event types of the envelopes that passed),
`versions: …` (type and `schemaversion`, with counts), `extensions: …` (every extension
attribute name seen), and a closing `N passed, M failed`. Exits 0 when every envelope passed
(and there was at least one), 1 otherwise, 2 when the SDK is missing.
"""

import json
import re
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone

try:
    from cloudevents.core.formats.json import JSONFormat
except ImportError as e:  # pragma: no cover
    print(f"cloudevents SDK not installed: {e} (pip install cloudevents)", file=sys.stderr)
    sys.exit(2)

CORE = {"id", "source", "type", "specversion", "subject", "time", "datacontenttype", "dataschema", "data"}

RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def instant(text: str) -> datetime:
    """An RFC 3339 timestamp as an aware datetime, the fraction truncated to microseconds."""
    m = RFC3339.match(text)
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    micro = int((m.group(7) or "").ljust(6, "0")[:6])
    if m.group(8):
        tz = timezone.utc
    else:
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = timezone(offset if m.group(9) == "+" else -offset)
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)


def check(line: str) -> tuple[list[str], dict]:
    raw = json.loads(line)
    fmt = JSONFormat()
    event = fmt.read(None, line.encode("utf-8"))
    problems = []

    def same(what, got, want):
        if got != want or type(got) is not type(want):
            problems.append(f"{raw.get('type')} {raw.get('id')}: {what}: SDK gave {got!r}, envelope has {want!r}")

    same("specversion", event.get_specversion(), raw["specversion"])
    same("id", event.get_id(), raw["id"])
    same("source", event.get_source(), raw["source"])
    same("type", event.get_type(), raw["type"])
    same("subject", event.get_subject(), raw["subject"])
    same("datacontenttype", event.get_datacontenttype(), raw.get("datacontenttype"))
    same("time", event.get_time(), instant(raw["time"]))
    same("data", event.get_data(), raw["data"])
    extensions = {k: v for k, v in raw.items() if k not in CORE}
    if not extensions:
        problems.append(f"{raw.get('type')} {raw.get('id')}: no extension attributes")
    for name, value in extensions.items():
        same(f"extension {name}", event.get_extension(name), value)

    # What the SDK writes back out: every attribute as it came in, `time` as the same instant.
    written = json.loads(fmt.write(event))
    for name in sorted(set(raw) | set(written)):
        if name == "time":
            same("written time", instant(written.get("time", "")), instant(raw["time"]))
        else:
            same(f"written {name}", written.get(name), raw.get(name))
    return problems, raw


def main() -> int:
    passed = failed = 0
    types = set()
    versions = Counter()
    extension_names = set()
    with open(sys.argv[1], encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                problems, raw = check(line)
            except Exception as e:  # the SDK refused it
                problems = [f"line {number}: the SDK refused the envelope: {type(e).__name__}: {e}"]
                raw = None
            if problems:
                failed += 1
                for p in problems:
                    print(p)
            else:
                passed += 1
                types.add(raw["type"])
                versions[f"{raw['type']} v{raw.get('schemaversion')}"] += 1
                extension_names.update(k for k in raw if k not in CORE)
    print("types: " + ", ".join(sorted(types)))
    print("versions: " + ", ".join(f"{k} ({n})" for k, n in sorted(versions.items())))
    print("extensions: " + ", ".join(sorted(extension_names)))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
