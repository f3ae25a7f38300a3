"""Prompt sets written for the project: training prompts for the draft's self-distillation, and a
held-out set (disjoint topics and templates) for measuring acceptance and for the demo.

Prompts are built from topic x instruction-template grids so the set is varied and reproducible
without shipping a data set.
"""

from __future__ import annotations

import itertools
import random

_TRAIN_TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the Roman Empire", "machine learning",
    "climate change", "the human heart", "electric cars", "the stock market", "honey bees", "chess",
    "the French Revolution", "vaccines", "recycling", "the moon landing", "coffee", "rainforests",
    "earthquakes", "the internet", "solar panels", "dinosaurs", "the immune system", "jazz music",
    "the Great Wall of China", "sleep", "bread baking", "the Olympic Games", "gravity", "sharks",
    "time management", "public speaking", "learning a new language", "healthy eating", "running a marathon",
    "saving money", "gardening", "meditation", "remote work", "renewable energy", "the printing press",
    "ancient Egypt", "DNA", "rainbows", "tides", "bicycles", "the Renaissance", "penguins", "glaciers",
    "smartphones", "democracy", "friendship", "museums", "space telescopes", "the periodic table",
    "antibiotics", "deserts", "coral reefs", "trains", "airplanes", "photography", "video games",
    "the Amazon river", "tea", "mountains", "hurricanes", "robots", "cryptography", "libraries",
    "volunteering", "camping", "wind turbines", "the human brain", "languages of the world", "elephants",
    "oceans", "pyramids", "bridges", "cloud computing", "databases", "open source software",
]

_HELDOUT_TOPICS = [
    "submarines", "origami", "the Silk Road", "lighthouses", "octopuses", "composting", "violins",
    "northern lights", "marathon training plans", "spreadsheets",
]

_TRAIN_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Write a short poem about {t}.",
    "Give me three practical tips related to {t}.",
    "What are the pros and cons of {t}?",
    "Write a short story that involves {t}.",
    "Summarize what people should know about {t} in a few sentences.",
    "How would you explain {t} to a ten-year-old?",
    "List five interesting facts about {t}.",
    "Write a friendly email to a colleague about {t}.",
    "What is a common misconception about {t}?",
    "Describe {t} in one paragraph.",
    "Why is {t} important?",
]

_HELDOUT_TEMPLATES = [
    "Tell me something surprising about {t}.",
    "Write a brief introduction to {t} for a blog post.",
    "What questions do beginners usually ask about {t}?",
    "Explain {t} step by step.",
]

_TRAIN_TASKS = [
    "What is {a} plus {b}? Explain your answer.", "If I have {a} apples and give away {b}, how many are left?",
    "Write a Python function that returns the sum of a list of numbers.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that counts the vowels in a word.",
    "How do I reverse a list in Python?", "What does the SQL statement SELECT do?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Give me a recipe for a simple tomato soup.", "Suggest a name for a small bakery.",
    "What is the difference between weather and climate?", "How many days are there in a leap year?",
]

_HELDOUT_TASKS = [
    "What is {a} times {b}? Show the steps.",
    "Write a Python function that returns the largest number in a list.",
    "Give me a recipe for pancakes.",
    "What is the difference between a virus and a bacterium?",
]


def _grid(topics, templates, tasks, seed: int, n_numbers: int) -> list[str]:
    rng = random.Random(seed)
    prompts = [tpl.format(t=t) for tpl, t in itertools.product(templates, topics)]
    for task in tasks:
        if "{a}" in task:
            prompts += [task.format(a=rng.randint(2, 99), b=rng.randint(2, 99)) for _ in range(n_numbers)]
        else:
            prompts.append(task)
    rng.shuffle(prompts)
    return prompts


def train_prompts() -> list[str]:
    """About a thousand varied training prompts (deterministic order)."""
    return _grid(_TRAIN_TOPICS, _TRAIN_TEMPLATES, _TRAIN_TASKS, seed=0, n_numbers=20)


def heldout_prompts() -> list[str]:
    """Held-out prompts: topics and templates never seen in training (deterministic order)."""
    return _grid(_HELDOUT_TOPICS, _HELDOUT_TEMPLATES, _HELDOUT_TASKS, seed=1, n_numbers=3)


def demo_prompts(n: int) -> list[str]:
    """The first ``n`` held-out prompts, cycled if ``n`` exceeds the set."""
    pool = heldout_prompts()
    return [pool[i % len(pool)] for i in range(n)]
