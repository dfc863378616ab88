"""TOKEN_TRACKING_MODE=manual: the exact id list being trained goes to SGLang, its ids and log probs come back.

Nothing is re-tokenized, so every id the engine conditioned on is a prefix of `sample.tokens`. With slime's
--partial-rollout a turn the engine aborted keeps what it had sampled, and the resumed episode continues that turn
from its last token (the engine's context is still the trajectory).
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

    resumable = True  # a partial rollout's aborted episode can continue from the trajectory it wrote

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
        self.state = state
        self.keep_aborted = bool(getattr(state.args, "partial_rollout", False))  # slime resumes them

    @property
    def context_length(self) -> int:
        return self.trajectory.context_length

    @property
    def response_length(self) -> int:
        return self.trajectory.response_length

    def written_turn(self) -> Turn:
        """The turn under way as the trajectory holds it: what it sampled before an abort (or all of it)."""
        ids = self.trajectory.response_ids()[self.state.turn_start :]
        return Turn(ids, "stop", text=self.tokenizer.decode(ids, skip_special_tokens=False))

    async def generate(self, sampling_params: dict) -> Turn:
        """The turn under way: what the engine samples now, after what it sampled before an abort (if anything)."""
        trajectory = self.trajectory
        written = self.written_turn().ids
        turn = await generate_turn(
            self.url,
            list(trajectory.sample.tokens),
            sampling_params,
            trajectory.track_log_probs,
            use_slime_post=self.use_slime_post,
            headers=self.headers,
        )
        if turn.finish_type == "abort" and not (self.keep_aborted and turn.ids):
            return turn
        ids = written + turn.ids
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        # a stop string may span the tokens sampled before and after an abort: the engine saw only its own part
        keep = cut_after_first_stop(ids, self.tokenizer, text, self.cut_at_stops)
        if keep < len(ids):
            turn = keep_first_tokens(turn, keep - len(written))
            ids = written + turn.ids
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        trajectory.add_generated(turn.ids, turn.log_probs, turn.meta_info)
        return Turn(ids, turn.finish_type, text=text, log_probs=turn.log_probs, meta_info=turn.meta_info)

    def add_observation(self, ids: list[int]) -> None:
        self.trajectory.add_observation(ids)

    async def finish(self, status) -> None:
        """Nothing to fetch: the trajectory was written turn by turn."""
