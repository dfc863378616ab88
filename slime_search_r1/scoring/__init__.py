"""How an answer is scored, for the reward (qa_em_format.py, generate_with_search.reward_func) and evaluate.py alike.

answers.py       the answer a response gives, Search-R1's normalisation, and EM, cover EM and token F1 over it
judge.py         an LLM judge behind any OpenAI-compatible chat endpoint (bounded, retried, every sample marked)
judge_prompt.txt the judge's default prompt: read it, or pass your own file
rewards.py       which of them a training reward is built on (SEARCH_R1_REWARD), and the judge's client for it
"""
