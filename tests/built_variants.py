"""Which kernel variants the installed cubins have (read from the manifests; no GPU needed): to skip a GPU test
whose variant a build lacks (the ci build has few), and to parametrize a sweep over every built variant."""
import pytest


def built_constants(family: str) -> list[dict]:
    """The distinct constants of every built variant of ``family`` itself (not of a composite family's other steps),
    in a stable order (none when no cubins are installed: a sweep collected without them has nothing to run)."""
    from mamba2_aot import runtime
    try:
        rows = [v for v in runtime.list_variants(family) if v["family"] == family]
    except Exception:
        return []
    return [dict(c) for c in sorted({tuple(sorted(v["constants"].items())) for v in rows})]


def is_built(family: str, **constants) -> bool:
    """Whether a built variant of ``family`` has these constants (others may differ)."""
    from mamba2_aot import runtime
    return any(all(v["constants"].get(k) == c for k, c in constants.items()) for v in runtime.list_variants(family))


def require_built(family: str, **constants) -> None:
    """Skip the calling test unless a built variant of ``family`` has these constants (a missing install is an
    error, not a skip)."""
    if not is_built(family, **constants):
        pytest.skip(f"no {family} variant with {constants} in this build")
