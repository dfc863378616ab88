"""An offline page of a run's trajectories: `python -m slime_search_r1.viewer INPUT... --output DIR`.

Reads slime's rollout dumps (--save-debug-rollout-data), the train dumps beside them (--save-debug-train-data) and
evaluate.py output folders, and writes DIR/index.html: one file with its script, style and data inside (no server, no
network), showing per run the log hooks' metrics (an evaluation's without those only training gives) and a filterable
sample list with each answer beside its gold answers, and per sample every token coloured by its loss mask with its
log probs, its tool calls and the plugin's record. Needs torch to read dumps, and transformers
for the tokens' text; neither slime nor a GPU.

__main__.py     the command line
build.py        inputs -> tokenizer -> page, written
inputs.py       which input is which (dumps, evaluate.py folders) and which train dump joins which rollout dump
dumps.py        slime's dump formats, loaded with torch.load(weights_only=True)
trajectories.py evaluate.py's trajectories.jsonl
samples.py      ViewSample and Run: one shape for a sample from any source
steps.py        a response as turns (loss-mask runs) and tool calls, by tool name
summary.py      a run's figures, by the log hooks' own functions and names
vocabulary.py   token ids -> their exact bytes, once per distinct id
page.py         the HTML: data as escaped JSON, each sample's detail parsed only when opened
assets/         the page's template, script and style (hand-written, embedded into every page)
"""

from slime_search_r1.viewer.build import Built, build_page
from slime_search_r1.viewer.dumps import InputError
from slime_search_r1.viewer.vocabulary import TokenizerError

__all__ = ["Built", "InputError", "TokenizerError", "build_page"]
