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
    # second batch: everyday life, work, science, places, culture, technology
    "the solar system", "Mars exploration", "comets", "the Big Bang", "atoms", "electricity", "magnets",
    "sound waves", "light and color", "nuclear power", "batteries", "plastic pollution", "air quality",
    "forests", "wetlands", "rivers", "the Arctic", "the Sahara", "the Himalayas", "islands", "caves",
    "wolves", "whales", "butterflies", "ants", "owls", "dolphins", "horses", "cats", "dogs", "frogs",
    "mushrooms", "sunflowers", "oak trees", "cacti", "seeds", "soil", "weather forecasts", "tornadoes",
    "snow", "thunderstorms", "fossils", "evolution", "genetics", "the human skeleton", "muscles",
    "the lungs", "digestion", "blood types", "nutrition labels", "vitamins", "drinking water",
    "first aid", "exercise", "yoga", "swimming", "football", "basketball", "tennis", "cycling races",
    "mountain climbing", "skiing", "board games", "card games", "puzzles", "knitting", "painting",
    "sculpture", "pottery", "poetry", "novels", "theater", "opera", "film making", "animation",
    "classical music", "rock music", "drums", "the piano", "guitars", "singing", "dance",
    "architecture", "skyscrapers", "castles", "cathedrals", "ancient Greece", "the Vikings",
    "the Industrial Revolution", "the Cold War", "the Middle Ages", "the Aztecs", "samurai",
    "the Ottoman Empire", "explorers", "maps", "compasses", "clocks", "calendars", "money",
    "banks", "taxes", "inflation", "small businesses", "marketing", "job interviews", "resumes",
    "teamwork", "leadership", "negotiation", "customer service", "email etiquette", "meetings",
    "project planning", "budgeting", "credit cards", "insurance", "renting an apartment",
    "buying a car", "moving to a new city", "cooking rice", "baking cookies", "making pasta",
    "chocolate", "cheese", "spices", "vegetarian diets", "food safety", "kitchen knives",
    "houseplants", "cleaning a house", "laundry", "home repairs", "pets", "parenting", "grandparents",
    "birthdays", "weddings", "holidays", "travel planning", "packing a suitcase", "airports",
    "hotels", "road trips", "public transport", "city parks", "farming", "tractors", "fishing",
    "beekeeping", "wine making", "electric guitars", "3D printing", "virtual reality",
    "artificial intelligence", "computer viruses", "passwords", "email", "social media",
    "search engines", "web browsers", "programming languages", "Python programming", "JavaScript",
    "Linux", "operating systems", "computer memory", "hard drives", "keyboards", "Wi-Fi",
    "satellites", "GPS", "drones", "self-driving cars", "rockets", "the space station",
    "telescopes", "microscopes", "vaccinations for pets", "hospitals", "nurses", "dentists",
    "teachers", "firefighters", "scientists", "engineers", "farmers", "pilots", "chefs",
    "writing an essay", "studying for exams", "note taking", "reading habits", "handwriting",
    "mathematics", "fractions", "prime numbers", "geometry", "probability", "statistics",
    "algebra", "the number zero", "infinity", "logic puzzles", "philosophy", "ethics",
    "happiness", "stress", "kindness", "curiosity", "creativity", "habits", "motivation",
    "minimalism", "journaling", "volunteering abroad", "recycling electronics", "water conservation",
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
    "What is the history of {t}?",
    "How does {t} work?",
    "Write a haiku about {t}.",
    "Give me a fun fact about {t}.",
    "What are the main ideas behind {t}?",
    "Write a short dialogue between two friends talking about {t}.",
    "What should I read to learn more about {t}?",
    "Compare {t} with something from everyday life.",
    "What are the biggest challenges related to {t}?",
    "Write a tweet about {t}.",
    "How has {t} changed over the last hundred years?",
    "Create a short quiz with three questions about {t}.",
    "What would the world be like without {t}?",
    "Give me a one-sentence definition of {t}.",
    "Write a motivational message inspired by {t}.",
    "What are some careers connected to {t}?",
    "Describe a day in the life of someone who works with {t}.",
    "What are the key terms someone should know about {t}?",
    "Write a product description for something related to {t}.",
    "How can {t} be used in education?",
    "What are three myths and facts about {t}?",
    "Write a short speech about {t}.",
    "Explain the science behind {t}.",
    "How do people around the world think about {t}?",
]

_HELDOUT_TEMPLATES = [
    "Tell me something surprising about {t}.",
    "Write a brief introduction to {t} for a blog post.",
    "What questions do beginners usually ask about {t}?",
    "Explain {t} step by step.",
]

_TRAIN_TASKS = [
    "What is {a} plus {b}? Explain your answer.", "If I have {a} apples and give away {b}, how many are left?",
    "What is {a} minus {b}?", "Divide {a} by {b} and round to two decimals.",
    "A train travels {a} kilometers in {b} hours. What is its average speed?",
    "What is {a} percent of {b}?", "Is {a} a prime number? Explain.",
    "Write a Python function that returns the sum of a list of numbers.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that counts the vowels in a word.",
    "Write a Python function that reverses a string.",
    "Write a Python function that computes the factorial of a number.",
    "Write a Python function that removes duplicates from a list.",
    "Write a Python class for a simple bank account.",
    "Write a JavaScript function that adds two numbers.",
    "Explain what a for loop does in Python.", "What is a dictionary in Python?",
    "How do I read a text file in Python?", "What is the difference between a list and a tuple in Python?",
    "How do I reverse a list in Python?", "What does the SQL statement SELECT do?",
    "Write an SQL query that counts the rows of a table named users.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Translate 'thank you very much' into German.",
    "Give me a recipe for a simple tomato soup.", "Give me a recipe for a green salad.",
    "How do I make scrambled eggs?", "How do I cook lentils?",
    "Suggest a name for a small bakery.", "Suggest three names for a pet goldfish.",
    "What is the difference between weather and climate?", "How many days are there in a leap year?",
    "What is the difference between a lake and a sea?", "What is the difference between speed and velocity?",
    "Why is the sky blue?", "Why do leaves change color in autumn?", "How do airplanes stay in the air?",
    "What causes the seasons?", "How does a refrigerator keep food cold?",
    "Write a thank-you note to a teacher.", "Write a short birthday message for my sister.",
    "Plan a three-day trip to a big city.", "Give me a weekly workout plan for a beginner.",
    "Correct the grammar: 'she go to school every days'.", "What is the capital of Japan?",
    "Name five countries in South America.", "Who wrote Romeo and Juliet?",
]

_HELDOUT_TASKS = [
    "What is {a} times {b}? Show the steps.",
    "Write a Python function that returns the largest number in a list.",
    "Give me a recipe for pancakes.",
    "What is the difference between a virus and a bacterium?",
]


def _grid(topics, templates, tasks, seed: int, n_numbers: int, n_pairs: int | None = None) -> list[str]:
    """Topic x template prompts (all pairs, or ``n_pairs`` drawn without replacement) plus the tasks,
    numbered tasks ``n_numbers`` times with random operands; shuffled with ``seed``."""
    rng = random.Random(seed)
    pairs = list(itertools.product(templates, topics))
    if n_pairs is not None:
        pairs = rng.sample(pairs, n_pairs)
    prompts = [tpl.format(t=t) for tpl, t in pairs]
    for task in tasks:
        if "{a}" in task:
            prompts += [task.format(a=rng.randint(2, 99), b=rng.randint(2, 99)) for _ in range(n_numbers)]
        else:
            prompts.append(task)
    rng.shuffle(prompts)
    return prompts


def train_prompts() -> list[str]:
    """About 1,200 varied training prompts (deterministic order): 1,100 of the ~11k topic x template
    pairs, so each topic appears with a few templates and no template dominates, plus the tasks."""
    return _grid(_TRAIN_TOPICS, _TRAIN_TEMPLATES, _TRAIN_TASKS, seed=0, n_numbers=6, n_pairs=1100)


def heldout_prompts() -> list[str]:
    """Held-out prompts: topics and templates never seen in training (deterministic order)."""
    return _grid(_HELDOUT_TOPICS, _HELDOUT_TEMPLATES, _HELDOUT_TASKS, seed=1, n_numbers=3)


def demo_prompts(n: int, first: int = 0) -> list[str]:
    """``n`` held-out prompts from the ``first``-th on, cycled past the end of the set."""
    pool = heldout_prompts()
    return [pool[i % len(pool)] for i in range(first, first + n)]
