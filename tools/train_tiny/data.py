"""Task generator for the libgdn tiny Qwen3.5 model.

Every example is a text prompt whose answer is a short string of digits, followed by the
eos token. All tasks need memory across the sequence (recurrent state / attention):

  recall   "recall: q=35 d=80 x=12 ? x="     -> "12"     (associative recall; NOT used by the
                                                             shipped model, see README)
  copy     "copy 61390 ="                        -> "61390"
  reverse  "reverse 51827 ="                     -> "72815"
  add      "add 47+85="                          -> "132"

Answers are digits only: the Qwen3.5 split regex makes every digit its own pre-token, so
the prompt/answer boundary never falls inside a pre-token and tokenising prompt and answer
separately gives the same ids as tokenising them together.

Held-out split: a prompt belongs to the held-out pool iff md5(prompt) % 10 == 0. Training
never emits such prompts, evaluation only emits them, so the two sets are disjoint by
construction (no need to store the training set).
"""
import hashlib
import random
import string

ALL_TASKS = ("recall", "copy", "reverse", "add")
# The shipped model is trained and evaluated on these (see README: associative recall stayed at chance
# level within the 2-core CPU budget, so it is kept here but not used).
TASKS = ("copy", "reverse", "add")
TASK_WEIGHTS = (0.2, 0.2, 0.6)          # training mix: addition is the slow one to learn

# difficulty knobs (kept in one place so the README can quote them)
RECALL_PAIRS = (2, 4)      # number of key=value pairs (inclusive range)
SEQ_DIGITS = (2, 5)        # length of copy / reverse digit strings
ADD_DIGITS = (1, 2)        # digits per addend


def is_heldout(prompt: str) -> bool:
    return int(hashlib.md5(prompt.encode()).hexdigest(), 16) % 10 == 0


def _digits(rng, n):
    return "".join(rng.choice(string.digits) for _ in range(n))


def make_example(rng: random.Random, task: str):
    if task == "recall":
        n = rng.randint(*RECALL_PAIRS)
        keys = rng.sample(string.ascii_lowercase, n)
        vals = [_digits(rng, 2) for _ in range(n)]
        q = rng.randrange(n)
        pairs = " ".join(f"{k}={v}" for k, v in zip(keys, vals))
        return f"recall: {pairs} ? {keys[q]}=", vals[q]
    if task == "copy":
        s = _digits(rng, rng.randint(*SEQ_DIGITS))
        return f"copy {s} =", s
    if task == "reverse":
        s = _digits(rng, rng.randint(*SEQ_DIGITS))
        return f"reverse {s} =", s[::-1]
    if task == "add":
        a = rng.randrange(10 ** rng.randint(*ADD_DIGITS))
        b = rng.randrange(10 ** rng.randint(*ADD_DIGITS))
        return f"add {a}+{b}=", str(a + b)
    raise ValueError(task)


def sample(rng: random.Random, heldout: bool):
    """One (task, prompt, answer) from the training pool (heldout=False) or the held-out pool."""
    while True:
        task = rng.choices(TASKS, weights=TASK_WEIGHTS)[0]
        prompt, answer = make_example(rng, task)
        if is_heldout(prompt) == heldout:
            return task, prompt, answer


def heldout_set(n: int, seed: int):
    """n distinct held-out examples, balanced over the tasks."""
    rng = random.Random(seed)
    out, seen = [], set()
    per_task = {t: 0 for t in TASKS}
    quota = -(-n // len(TASKS))
    while len(out) < n:
        task, prompt, answer = sample(rng, heldout=True)
        if prompt in seen or per_task[task] >= quota:
            continue
        seen.add(prompt)
        per_task[task] += 1
        out.append((task, prompt, answer))
    return out


def tokenizer_corpus(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        _, p, a = sample(rng, heldout=False)
        yield p + a
