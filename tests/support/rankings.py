"""Comparing retrieval answers: the tests and the hostile-client benchmark check answers the same way."""


def same_ranking(a: list[dict], b: list[dict], tolerance: float = 1e-4) -> bool:
    """Equal hits, allowing two documents whose scores tie within `tolerance` to swap places."""
    if len(a) != len(b):
        return False
    for hit_a, hit_b in zip(a, b, strict=True):
        if abs(hit_a["score"] - hit_b["score"]) > tolerance:
            return False
        if hit_a["document"] != hit_b["document"]:
            tied = [h["document"] for h in b if abs(h["score"] - hit_a["score"]) <= tolerance]
            if hit_a["document"] not in tied:
                return False
    return True
