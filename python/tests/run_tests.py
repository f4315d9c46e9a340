"""Runs this folder's tests with pytest, or, where pytest is not installed (a GPU machine with
only PyTorch), with the few pytest features the tests use: parametrize, skipif and raises.

    python3 run_tests.py [pytest arguments]
"""
import itertools
import os
import re
import sys
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))


class _Raises:
    def __init__(self, expected, match=None):
        self.expected, self.match = expected, match

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError("did not raise %s" % self.expected.__name__)
        if not issubclass(kind, self.expected):
            return False
        if self.match and not re.search(self.match, str(value)):
            raise AssertionError("%r does not match %r" % (str(value), self.match))
        return True


def _stand_in():
    pytest = types.ModuleType("pytest")

    def parametrize(names, values, ids=None):
        def mark(f):
            f.__dict__.setdefault("params", []).append(([n.strip() for n in names.split(",")], list(values)))
            return f
        return mark

    def skipif(condition, reason=""):
        def mark(f):
            if condition:
                f.skip = reason
            return f
        return mark

    pytest.mark = types.SimpleNamespace(parametrize=parametrize, skipif=skipif)
    pytest.raises = _Raises
    return pytest


def _cases(f):
    """Every combination of the function's parametrize values, as keyword arguments."""
    grids = [[dict(zip(names, v if len(names) > 1 else (v,))) for v in values]
             for names, values in getattr(f, "params", [])]
    for combo in itertools.product(*grids):
        kwargs = {}
        for part in combo:
            kwargs.update(part)
        yield kwargs


def run_without_pytest():
    sys.modules["pytest"] = _stand_in()
    sys.path.insert(0, HERE)
    passed = failed = skipped = 0
    for name in sorted(os.listdir(HERE)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        module = __import__(name[:-3])
        for test_name, f in sorted(vars(module).items()):
            if not (test_name.startswith("test_") and callable(f)):
                continue
            for kwargs in _cases(f):
                label = "%s::%s%s" % (name, test_name, kwargs or "")
                if getattr(f, "skip", None) is not None:
                    skipped += 1
                    continue
                try:
                    f(**kwargs)
                    passed += 1
                except Exception:
                    failed += 1
                    print("FAILED", label)
                    traceback.print_exc()
    print("%d passed, %d failed, %d skipped (without pytest)" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        import pytest
    except ImportError:
        sys.exit(run_without_pytest())
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", HERE] + sys.argv[1:]))
