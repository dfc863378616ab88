"""What the offline rollout demo's 'model' does: ten questions whose answers are in the embedded mini-Wikipedia, each
with the turns it takes. The scripted stand-in for SGLang (slime_search_r1/standin/policy.py) writes them, in either
protocol (XML tags or chat tool calls), with a call to every other enabled tool before the answer.

The turns are fixed in advance: the policy never reads what the searches return. The questions' evidence articles are
in the 10,033 summaries, so the real retriever finds them for the scripted queries; one episode answers wrongly on
purpose, one answers without searching, one searches twice, so that the rewards and the trajectories differ.
"""

from dataclasses import dataclass

DATA_SOURCE = "mini_wiki"


@dataclass(frozen=True)
class Scripted:
    question: str
    golden_answers: tuple[str, ...]
    evidence: str  # the article (its summary's title) that holds the answer
    turns: tuple[tuple[str, str], ...]  # ("search", query) or ("answer", text), in order


EPISODES = (
    Scripted("Which is the largest continent", ("Asia",), "Asia",
             (("search", "largest continent"), ("answer", "Asia"))),
    Scripted("In which city were The Beatles formed", ("Liverpool",), "The Beatles",
             (("search", "The Beatles formed city"), ("answer", "Liverpool"))),
    Scripted("Where is Microsoft headquartered", ("Redmond, Washington", "Redmond"), "Microsoft",
             (("search", "Microsoft headquarters"), ("answer", "Redmond, Washington"))),
    Scripted("Who wrote The Canterbury Tales", ("Geoffrey Chaucer", "Chaucer"), "The Canterbury Tales",
             (("search", "The Canterbury Tales author"), ("answer", "Geoffrey Chaucer"))),
    Scripted("Who composed The Rite of Spring", ("Igor Stravinsky", "Stravinsky"), "The Rite of Spring",
             (("search", "The Rite of Spring composer"), ("answer", "Igor Stravinsky"))),
    Scripted("Which element has the chemical symbol Mg", ("magnesium",), "Magnesium",
             (("search", "Mg chemical element"), ("answer", "magnesium"))),
    Scripted("Which band did Freddie Mercury lead", ("Queen",), "Queen (band)",
             (("search", "Freddie Mercury band"), ("answer", "Queen"))),
    # two searches before the answer
    Scripted("Where is Apple Inc. headquartered", ("Cupertino, California", "Cupertino"), "Apple Inc.",
             (("search", "Apple founders Steve Jobs"), ("search", "Apple Inc. headquarters"),
              ("answer", "Cupertino, California"))),
    # no search: answered at once
    Scripted("What is the capital of Uganda", ("Kampala",), "Uganda", (("answer", "Kampala"),)),
    # the search finds the painter, the script answers another one: EM 0
    Scripted("Who painted The Garden of Earthly Delights", ("Hieronymus Bosch", "Bosch"),
             "The Garden of Earthly Delights",
             (("search", "The Garden of Earthly Delights painter"), ("answer", "Caspar David Friedrich"))),
)  # fmt: skip


def expected_em() -> float:
    """The exact-match share the scripts give (an answer is scripted right or wrong, whatever the searches return)."""
    right = sum(episode.turns[-1][1] in episode.golden_answers for episode in EPISODES)
    return right / len(EPISODES)
