"""The answer score a training reward is built on (SEARCH_R1_REWARD), and how a sample's answer gets it.

  em, f1, cover_em  answers.py's rule scores (Search-R1's normalisation)
  judge             an LLM judge (judge.py) behind the endpoint the judge.* settings name, one client per process

grade() gives a Grade: the answer's score in [0, 1], or None when the judge gave no usable verdict (its endpoint was
down, or it answered without a verdict after every attempt). Such a sample is marked, never scored 0 in silence:
reward_func keeps it out of its group's advantages (remove_sample) and the log hooks count it. qa_em_format.py turns
the score into the shaped reward with the format bonus.
"""

import re
from dataclasses import dataclass

from slime_search_r1.registry import ANSWER_SCORES, JUDGE
from slime_search_r1.scoring.judge import JudgeClient, JudgeConfig, JudgePrompt, Verdict

_QUESTION = re.compile(r"Question:\s*(.*?)\s*(?:\n|<\|im_end\|>|$)")


@dataclass(frozen=True)
class Grade:
    name: str  # which score: em, f1, cover_em or judge
    value: float | None  # the answer's score in [0, 1]; None when the judge left the sample unscored
    verdict: Verdict | None = None  # the judge's, with its status, reply and error

    @property
    def scored(self) -> bool:
        return self.value is not None


_clients: dict[tuple, JudgeClient] = {}


def judge_client(config) -> JudgeClient:
    """The judge the settings name, built once per process (its prompt file read once); its requests in flight,
    attempts and timeout are JudgeConfig's defaults, as evaluate.py's."""
    judge = config.judge
    key = (judge.url, judge.model, judge.prompt, judge.max_tokens, judge.api_key)
    if key not in _clients:
        settings = JudgeConfig(url=judge.url, model=judge.model, max_tokens=judge.max_tokens)
        _clients[key] = JudgeClient(settings, JudgePrompt.load(judge.prompt), api_key=judge.api_key)
    return _clients[key]


def question_of(sample) -> str:
    """The question a sample asks: metadata["question"] when the data carries it, else the last "Question: ..." of
    its prompt (Search-R1's instruction and the chat data both end the user turn with it), else the user turn."""
    question = (getattr(sample, "metadata", None) or {}).get("question")
    if isinstance(question, str) and question.strip():
        return question.strip()
    prompt = sample.prompt
    if not isinstance(prompt, str):
        users = [m.get("content") or "" for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else ""
    found = _QUESTION.findall(prompt)
    return found[-1] if found else prompt.strip()


async def grade(config, name: str, question: str, golden_answers: list[str], answer: str | None) -> Grade:
    """The answer's score under `name` (registry.reward_names()); the judge is asked only for `judge`."""
    if name != JUDGE:
        return Grade(name, ANSWER_SCORES.get(name)(answer, golden_answers))
    verdict = await judge_client(config).judge(question, golden_answers, answer)
    return Grade(name, verdict.score if verdict.scored else None, verdict)
