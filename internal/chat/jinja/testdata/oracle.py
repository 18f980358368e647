"""Reference renderer for the differential test: Python's Jinja2 configured the way
chat templates are rendered for models (trim_blocks, lstrip_blocks, loop controls, a
tojson that keeps key order and does not escape HTML, raise_exception, strftime_now).

Reads a JSON list of cases [{"template": str, "context": {...}}] on stdin and writes a
JSON list of {"out": str} or {"error": str}.
"""
import json
import sys
from datetime import datetime, timezone

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    now = datetime(2026, 11, 22, 9, 30, 0, tzinfo=timezone.utc)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    results = []
    for case in json.load(sys.stdin):
        try:
            out = env.from_string(case["template"]).render(**case["context"])
            results.append({"out": out})
        except Raised as e:
            results.append({"error": "raised: " + str(e)})
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            results.append({"error": type(e).__name__ + ": " + str(e)})
    json.dump(results, sys.stdout)


main()
