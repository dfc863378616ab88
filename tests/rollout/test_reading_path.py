"""The rollout reads in a few files: one XML episode with a search turn and an answer turn runs code in at most ten
modules of the package (settings and slime flag checks, the loop and the modules it calls), so that a newcomer
reads loop.py and what it calls in one sitting."""

import sys

from slime.utils.types import Sample
from generate_with_search import generate
from support.episodes import ANSWER_TURN, QUESTION, SEARCH_TURN, searches, xml_sample
from support.slime_rollout import slime_sampling_params

MOST_MODULES = 10


async def test_one_search_episode_runs_code_in_at_most_ten_package_modules(
    make_args, tokenizer, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, sample, sampling_params = make_args(), xml_sample(tokenizer), slime_sampling_params(1024)
    ran: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":  # a Python function (or a coroutine resumed) starts running in this thread
            # the module whose globals the code runs in: a dataclass's generated __init__ counts for its module
            module = frame.f_globals.get("__name__", "")
            if module.split(".")[0] == "slime_search_r1":
                ran.add(module)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        sample = await generate(args, sample, sampling_params)
    finally:
        sys.setprofile(previous)
    assert sample.status == Sample.Status.COMPLETED and searches(sample) == 1  # the episode ran both turns
    assert len(ran) <= MOST_MODULES, f"{len(ran)} modules: " + ", ".join(sorted(ran))
