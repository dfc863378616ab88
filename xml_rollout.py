"""Search-R1's XML-tag protocol (LLM_API_MODE=generate): <search>/<answer> in, <information> back.

With TOKEN_TRACKING_MODE=manual each turn sends SGLang the exact id list being trained and appends
the ids and log probs it sampled; observations are tokenized on their own (loss mask 0). Nothing is
re-tokenized, so the engine's context is always a prefix of `sample.tokens`. router_radix sends text
through the slime router instead and takes the trajectory from its cache.
"""

from chat_template import chat_template_kwargs
from episode import encode_prompt, episode_budget, run_episode, timed_search
from observations import information_ids, invalid_action_ids
from search_r1_config import SearchR1Config
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from token_drivers import ExactDriver, GeneratedTurn, RadixDriver
from xml_actions import STOP_STRINGS, parse_action, with_stop_strings


def prompt_string(args, tokenizer, sample: Sample) -> str:
    """The prompt as slime's --apply-chat-template leaves it, rendering messages here if it did not."""
    if isinstance(sample.prompt, str):
        return sample.prompt
    return tokenizer.apply_chat_template(
        list(sample.prompt), tokenize=False, add_generation_prompt=True, **chat_template_kwargs(args, sample)
    )


class XmlProtocol:
    def __init__(self, tokenizer, config: SearchR1Config, stats, sampling_params: dict):
        self.tokenizer, self.config, self.stats = tokenizer, config, stats
        self.sampling_params = {**sampling_params, "stop": with_stop_strings(sampling_params.get("stop"))}
        self.action = None
        self.aborted = None

    def read(self, turn: GeneratedTurn, turn_index: int) -> bool:
        self.action = parse_action(turn.text)
        if self.action.kind == "invalid" and turn.finish_type != "length":  # a turn cut short is the budget's doing
            self.stats.invalid_actions += 1
        return self.action.kind == "answer"

    async def respond(self, turn: GeneratedTurn) -> list[int]:
        if self.action.kind != "search":
            return invalid_action_ids(self.tokenizer)
        contents = await timed_search(self.config, self.action.content, self.stats, self.aborted)
        ids, truncated = information_ids(self.tokenizer, contents, self.config.max_obs_tokens)
        self.stats.truncated_observations += truncated
        return ids

    def accept(self) -> None:
        pass

    def on_finish(self, sample: Sample) -> None:
        pass


async def run_xml_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    state = GenerateState(args)
    tokenizer = state.tokenizer
    prompt_text = prompt_string(args, tokenizer, sample)
    prompt_ids = encode_prompt(tokenizer, prompt_text)
    if config.token_tracking_mode == "router_radix":
        await RadixDriver.check_router(args, config)
        driver = RadixDriver(args, sample, tokenizer, prompt_ids, config, prompt_text=prompt_text)
    else:
        driver = ExactDriver(args, sample, tokenizer, prompt_ids, config, cut_at_stops=STOP_STRINGS)
    protocol = XmlProtocol(tokenizer, config, driver.stats, sampling_params)
    budget = episode_budget(args, sampling_params, config, evaluation)
    return await run_episode(state, driver, protocol, config, budget, evaluation)
