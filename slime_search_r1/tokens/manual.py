"""TOKEN_TRACKING_MODE=manual: the exact id list being trained goes to SGLang, its ids and log probs come back.

Nothing is re-tokenized, so every id the engine conditioned on is a prefix of `sample.tokens`.
"""

from slime_search_r1.tokens.engine import engine_url, generate_turn, keep_first_tokens, routing_headers
from slime_search_r1.turns import Turn


def cut_after_first_stop(ids: list[int], tokenizer, text: str, stops: tuple[str, ...]) -> int:
    """How many of `ids` to keep so the turn ends with the token that completes its first stop string.

    An engine that honours stop strings already ends there; one that ran past them is cut, which keeps
    every kept token and log prob exact (they are a prefix of what was sampled).
    """
    hits = [(pos, stop) for stop in stops if (pos := text.find(stop)) >= 0]
    if not hits or len(ids) <= 1:
        return len(ids)
    pos, stop = min(hits)

    def holds_stop(count: int) -> bool:
        return tokenizer.decode(ids[:count], skip_special_tokens=False).find(stop) == pos

    if not holds_stop(len(ids) - 1):  # the usual case: the stop string ends in the last token
        return len(ids)
    low, high = 1, len(ids) - 1
    while low < high:
        mid = (low + high) // 2
        if holds_stop(mid):
            high = mid
        else:
            low = mid + 1
    return low


class ManualDriver:
    """Each turn sends `input_ids` = the trajectory so far and appends what the engine sampled to the trajectory."""

    @classmethod
    async def prepare(cls, state) -> None:
        """Nothing to check: any SGLang engine or router serves /generate."""

    def __init__(self, state, trajectory, protocol):
        self.tokenizer = state.tokenizer
        self.trajectory = trajectory
        self.url = engine_url(state.args, state.config.engine_model)
        self.use_slime_post = state.config.engine_transport == "slime" or bool(
            getattr(state.args, "use_distributed_post", False)
        )
        self.headers = routing_headers(state.args, state.sample)
        self.cut_at_stops = protocol.cut_at_stops  # an engine that ignores stop strings is cut after the first

    @property
    def context_length(self) -> int:
        return self.trajectory.context_length

    @property
    def response_length(self) -> int:
        return self.trajectory.response_length

    async def generate(self, sampling_params: dict) -> Turn:
        trajectory = self.trajectory
        turn = await generate_turn(
            self.url,
            list(trajectory.sample.tokens),
            sampling_params,
            trajectory.track_log_probs,
            use_slime_post=self.use_slime_post,
            headers=self.headers,
        )
        if turn.finish_type == "abort":
            return turn
        text = self.tokenizer.decode(turn.ids, skip_special_tokens=False)
        keep = cut_after_first_stop(turn.ids, self.tokenizer, text, self.cut_at_stops)
        if keep < len(turn.ids):
            turn = keep_first_tokens(turn, keep)
            text = self.tokenizer.decode(turn.ids, skip_special_tokens=False)
        trajectory.add_generated(turn.ids, turn.log_probs, turn.meta_info)
        turn.text = text
        return turn

    def add_observation(self, ids: list[int]) -> None:
        self.trajectory.add_observation(ids)

    async def finish(self, status) -> None:
        """Nothing to fetch: the trajectory was written turn by turn."""
