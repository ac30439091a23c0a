"""reasoning-gym as a Tandem Python environment: a mix of procedural tasks, items from
`reasoning_gym.create_dataset(name, size=, seed=)`, scores from each dataset's own
`score_answer`.

    [environment]
    plugin = "python"
    class = "tandem_envs.reasoning_gym_env:ReasoningGym"
    options = { tasks = ["leg_counting", "basic_arithmetic"], size = 1000 }

- train item i is task `tasks[i % T]`, entry `(i // T) % size` of that task's dataset built
  with seed `seed * 1009 + k` (k: the task's position); the split has `size * T` items.
- held-out item j comes from datasets built with a different seed (`seed * 1009 + k + 500`),
  skipping any question that is also a training question of the task; `held_out` items.
- the prompt asks for the answer between <answer> and </answer> (`answer_format = "tags"`,
  the default), takes the whole completion as the answer (`answer_format = "raw"`), or takes
  the last number in the completion (`answer_format = "number"`: for numeric tasks and models
  too small to follow the tag instruction).
- score: the extracted answer through the entry's dataset's `score_answer` (a value in
  [0, 1]); entries are looked up by the item's metadata in this worker's own datasets, so
  the original entry (not its JSON copy) is scored.
"""

import re

import reasoning_gym
from reasoning_gym.utils import extract_answer

INSTRUCTION = "\n\nGive your final answer between <answer> and </answer>."
NUMBER_INSTRUCTION = "\n\nAnswer with a number."
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class ReasoningGym:
    def __init__(self, seed, held_out, tasks=("leg_counting", "basic_arithmetic"), size=1000,
                 answer_format="tags", task_config=None):
        if not tasks:
            raise ValueError("tasks is empty: name at least one reasoning-gym dataset")
        if answer_format not in ("tags", "raw", "number"):
            raise ValueError(f"answer_format {answer_format!r} is not 'tags', 'raw' or 'number'")
        self.tasks = list(tasks)
        self.size = int(size)
        self.format = answer_format
        config = task_config or {}
        base = int(seed) * 1009
        self.train = [
            reasoning_gym.create_dataset(t, size=self.size, seed=base + k, **config.get(t, {}))
            for k, t in enumerate(self.tasks)
        ]
        self.held = []  # (task position, entry index in the held-out dataset)
        per_task = -(-int(held_out) // len(self.tasks)) if held_out else 0
        self.held_sets = []
        for k, t in enumerate(self.tasks):
            seen = {self.train[k][i]["question"] for i in range(self.size)}
            ds = reasoning_gym.create_dataset(
                t, size=max(4 * per_task, 1), seed=base + k + 500, **config.get(t, {})
            )
            keep = [i for i in range(len(ds)) if ds[i]["question"] not in seen][:per_task]
            self.held_sets.append((ds, keep))
        for j in range(per_task):
            for k, (_, keep) in enumerate(self.held_sets):
                if j < len(keep):
                    self.held.append((k, keep[j]))
        self.held = self.held[: int(held_out)]

    def describe(self):
        return {
            "splits": {"train": self.size * len(self.tasks), "held_out": len(self.held)},
            "components": [],
            "sources": self.tasks,
            "reward_range": [0.0, 1.0],
        }

    def _entry(self, split, index):
        if split == "train":
            k = index % len(self.tasks)
            i = (index // len(self.tasks)) % self.size
            return k, i, self.train[k][i]
        if split == "held_out":
            if not 0 <= index < len(self.held):
                raise IndexError(f"held-out item {index} does not exist: the split has {len(self.held)}")
            k, i = self.held[index]
            return k, i, self.held_sets[k][0][i]
        raise ValueError(f"no split {split!r} (train, held_out)")

    def item(self, split, index):
        k, i, e = self._entry(split, index)
        if self.format == "number":
            prompt = e["question"].rstrip() + NUMBER_INSTRUCTION
        else:
            prompt = e["question"] + (INSTRUCTION if self.format == "tags" else "")
        return {
            "id": f"{split}-{index}",
            "prompt": prompt,
            "answer": str(e["answer"]),
            "source": self.tasks[k],
            "metadata": {"split": split, "index": index},
        }

    def score(self, items, completions):
        out = []
        for item, c in zip(items, completions):
            meta = item["metadata"]
            k, _, e = self._entry(meta["split"], int(meta["index"]))
            text = c["text"]
            if self.format == "tags":
                answer = extract_answer(text)
            elif self.format == "number":
                found = NUMBER.findall(text)
                answer = found[-1] if found else None
            else:
                answer = text.strip()
            ds = self.train[k] if meta["split"] == "train" else self.held_sets[k][0]
            out.append(float(ds.score_answer(answer, e)))
        return out
