"""Training prompts for chat targets, generated offline and deterministically (no downloads, no eval sets).

DeepSpec trains on the target's own answers to a large chat corpus (docs/training.md). Offline, the
stand-in is a generator of user turns in three families, in equal shares:

- math: word problems and exercises from templates with random names, objects and numbers; most end with the
  "reason step by step ... \\boxed{}" instruction that math benchmarks append;
- code: tasks built from the CPython standard library's own functions: implement a function from its signature
  and docstring summary, explain / review / test / document a short function's source;
- general: explanations, comparisons, advice, writing and editing requests from templates over topic lists, and
  questions about the Python language topics of `pydoc_data.topics` (the stdlib's help text).

Every prompt is a record {"turns": [user_text]} like the eval sets'. The same (stdlib root, count, seed) give the
same list; exact duplicates are dropped. The eval prompt sets are never read here; a test checks that no
generated prompt equals or nearly duplicates one of them (word 3-gram Jaccard).
"""
from __future__ import annotations

import ast
import functools
import json
import random
import re
from pathlib import Path

from dspark.models.embedded_target.corpus import Corpus
from dspark.models.errors import ConfigError

BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
MIN_CHAT_PROMPTS = 3  # one of each family

NAMES = ("Amara", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam",
         "Maya", "Noah", "Olga", "Pavel", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wen", "Yusuf", "Zoe")
ITEMS = (("apples", 0.4), ("notebooks", 2.5), ("pencils", 0.75), ("stickers", 0.1), ("cupcakes", 1.5),
         ("tickets", 12.0), ("plants", 6.0), ("books", 9.0), ("candles", 3.5), ("marbles", 0.05),
         ("postcards", 0.8), ("sandwiches", 4.5), ("bracelets", 7.0), ("mugs", 8.5), ("kites", 11.0))
TOPICS = ("photosynthesis", "compound interest", "recursion", "the water cycle", "inflation", "black holes",
          "vaccines", "plate tectonics", "supply and demand", "machine learning", "the French Revolution",
          "public-key cryptography", "climate change", "the immune system", "blockchains", "the Pythagorean theorem",
          "natural selection", "hash tables", "the stock market", "renewable energy", "the printing press",
          "quantum entanglement", "sleep", "the Roman Empire", "volcanoes", "binary search", "electric cars",
          "jazz music", "the scientific method", "operating systems", "the human heart", "coral reefs",
          "probability", "the internet", "democracy", "bread baking", "tides", "memory in the brain",
          "solar panels", "version control")
AUDIENCES = ("a ten-year-old", "a high school student", "a busy manager", "a complete beginner", "an engineer",
             "my grandmother", "a new employee", "a curious teenager")
FORMS = ("short poem", "haiku", "limerick", "short story", "product description", "motivational speech",
         "diary entry", "news headline and lede", "dialogue between two friends", "song chorus")
ACTIVITIES = ("learning a new language", "running a first marathon", "saving money", "studying for exams",
              "working from home", "starting a vegetable garden", "public speaking", "writing clean code",
              "traveling on a budget", "staying focused", "cooking for a large group", "moving to a new city")
RECIPIENTS = ("my landlord", "a hiring manager", "my team", "a customer", "my professor", "a neighbour",
              "the city council", "a conference organizer")
SUBJECTS = ("a broken heating system", "a delayed project deadline", "a request for a reference letter",
            "a refund for a damaged order", "rescheduling a meeting", "a noise complaint", "a new recycling scheme",
            "volunteering at an event")


def generate_chat_prompts(stdlib: Corpus, count: int = 6000, seed: int = 0) -> list[dict]:
    """`count` distinct {"turns": [text]} records, a third per family (module docstring), shuffled."""
    if count < MIN_CHAT_PROMPTS:
        raise ConfigError(f"chat prompt count must be >= {MIN_CHAT_PROMPTS}, got {count}")
    rng = random.Random(seed)
    functions = stdlib_functions(stdlib)
    families = (lambda: math_prompt(rng), lambda: code_prompt(rng, functions), lambda: general_prompt(rng))
    seen: set[str] = set()
    texts: list[str] = []
    attempts = 0
    while len(texts) < count:
        attempts += 1
        if attempts > 50 * count:
            raise ConfigError(f"could only make {len(texts)} distinct chat prompts of {count}; ask for fewer")
        text = families[len(texts) % 3]()
        if text not in seen:
            seen.add(text)
            texts.append(text)
    rng.shuffle(texts)
    return [{"turns": [text]} for text in texts]


def math_prompt(rng: random.Random) -> str:
    name, other = rng.sample(NAMES, 2)
    (item, price), (item2, _) = rng.sample(ITEMS, 2)
    a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
    pct, hours, speed = rng.choice((10, 15, 20, 25, 30, 40)), rng.randint(2, 9), rng.randint(30, 90)
    templates = (
        f"{name} has {a} {item}. {other} gives {name} {b} bags with {c} {item} in each bag. {name} then shares "
        f"half of all the {item} with friends. How many {item} does {name} keep?",
        f"A shop sells {item} for ${price:.2f} each. {name} buys {a} {item} and pays with a "
        f"${(a * price // 10 + 1) * 10:.0f} bill. How much change does {name} get?",
        f"{name} reads {b} pages every weekday and {c * 3} pages on each weekend day. How many pages does {name} "
        f"read in {c} weeks?",
        f"A train travels at {speed} km/h for {hours} hours, then at {speed + 20} km/h for {c} more hours. What is "
        f"the total distance, and what is the average speed over the whole trip?",
        f"The price of a jacket is ${a * 5}. It is discounted by {pct}%, and then a {b}% sales tax is added to the "
        f"discounted price. What is the final price?",
        f"{name} and {other} share {a * c} {item} in the ratio {b}:{c}. How many {item} does each of them get?",
        f"Solve for x: {b}x + {a} = {b * c + a + b}. Show your work.",
        f"What is the sum of all multiples of {b} or {c} that are less than {a * 10}?",
        f"A rectangle has a perimeter of {2 * (a + b)} cm and one side of {a} cm. What is its area?",
        f"A bag has {a} red marbles and {b * c} blue marbles. Two marbles are drawn without replacement. What is "
        f"the probability that both are blue?",
        f"{name} saves ${b * 10} in the first month and ${c} more each month than the month before. How much has "
        f"{name} saved after {b + c} months?",
        f"A recipe for {c} people needs {a * 10} grams of flour and {b} eggs. How much of each is needed for "
        f"{c * 3 + 1} people?",
        f"{name} runs {c} km on Monday. Each day after that, {name} runs {pct}% farther than the day before. How "
        f"far does {name} run on Thursday? Round to two decimals.",
        f"A tank holds {a * 20} liters. One pipe fills it in {hours} hours and another empties it in {hours + c} "
        f"hours. Starting empty with both open, how long does it take to fill the tank?",
        f"How many ways can {c + 3} different {item2} be arranged in a row if two particular ones must be next to "
        f"each other?",
        f"Find the greatest common divisor and the least common multiple of {a * b} and {a * c + b}.",
        f"A {item[:-1]} factory makes {a * 100} units a day. {pct}% are defective, and half of the defective units "
        f"can be repaired. How many sellable units are made in {b} days?",
        f"Convert {a * 37} minutes into hours and minutes, then tell how many seconds that is in total.",
    )
    text = rng.choice(templates)
    return f"{text}\n{BOXED}" if rng.random() < 0.6 else text


@functools.lru_cache(maxsize=2)  # parsing the stdlib takes seconds; a Corpus is immutable
def stdlib_functions(stdlib: Corpus, max_lines: int = 25) -> list[tuple[str, str, str, str]]:
    """(module, signature, docstring summary, source) of the training files' documented short functions."""
    found = []
    for relative in stdlib.train_files:
        try:
            source = stdlib.read(relative)
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        module = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            summary = docstring_summary(ast.get_docstring(node) or "")
            length = node.end_lineno - node.lineno + 1
            if summary and 4 <= length <= max_lines:
                signature = f"{node.name}({ast.unparse(node.args)})"
                body = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                found.append((module, signature, summary, dedent_block(body)))
    if not found:
        raise ConfigError(f"no documented functions found under {stdlib.root}: point --stdlib at a CPython Lib/")
    return found


def docstring_summary(doc: str) -> str:
    """The first sentence of a docstring when it reads like a task (20..200 chars, starts with a letter)."""
    first = re.split(r"(?<=[.!?])\s", " ".join(doc.split()), maxsplit=1)[0].strip()
    return first if 20 <= len(first) <= 200 and first[0].isalpha() else ""


def dedent_block(text: str) -> str:
    lines = text.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def code_prompt(rng: random.Random, functions: list[tuple[str, str, str, str]]) -> str:
    module, signature, summary, source = rng.choice(functions)
    task = summary[0].lower() + summary[1:]
    templates = (
        f"Write a Python function `{signature}` that does the following: {task} Explain your approach briefly.",
        f"Implement `{signature}` in Python. Its docstring says: \"{summary}\" Include a few example calls.",
        f"Write a solution to the following problem and make sure it is correct:\n```python\ndef {signature}:\n"
        f"    \"\"\"{summary}\"\"\"\n```",
        f"Explain what this function from Python's `{module}` module does, line by line:\n```python\n{source}\n```",
        f"Review the following Python code and suggest improvements:\n```python\n{source}\n```",
        f"Write pytest unit tests for this function:\n```python\n{source}\n```",
        f"Add type hints and a more detailed docstring to this function:\n```python\n{source}\n```",
        f"What is the time complexity of the following function? Justify your answer.\n```python\n{source}\n```",
        f"Rewrite this Python function in JavaScript:\n```python\n{source}\n```",
    )
    return rng.choice(templates)


def general_prompt(rng: random.Random) -> str:
    topic, topic2 = rng.sample(TOPICS, 2)
    templates = (
        f"Explain {topic} to {rng.choice(AUDIENCES)}.",
        f"What are the main differences between {topic} and {topic2}?",
        f"Write a {rng.choice(FORMS)} about {topic}.",
        f"Give me {rng.randint(3, 7)} practical tips for {rng.choice(ACTIVITIES)}.",
        f"Write a polite email to {rng.choice(RECIPIENTS)} about {rng.choice(SUBJECTS)}.",
        f"Summarize the history of {topic} in {rng.randint(3, 6)} sentences.",
        f"What are common misconceptions about {topic}? Correct each one.",
        f"Create a {rng.randint(3, 6)}-question quiz about {topic}, with answers.",
        f"Outline a {rng.randint(2, 8)}-week study plan for understanding {topic}.",
        f"Argue for and against this statement: \"{rng.choice(ACTIVITIES).capitalize()} is overrated.\"",
        f"Describe how {topic} might change in the next {rng.choice((10, 20, 50))} years.",
        f"Write an analogy that connects {topic} with {topic2}, then explain where it breaks down.",
        f"In Python, explain {rng.choice(PYDOC_TOPICS)} with a short example.",
    )
    return rng.choice(templates)


PYDOC_TOPICS = ("the assert statement", "augmented assignment", "the with statement", "exception handling",
                "list comprehensions", "generators and yield", "decorators", "the global and nonlocal statements",
                "operator precedence", "slicing", "string formatting", "class definitions", "lambda expressions",
                "the import system", "truth value testing", "boolean operations", "the match statement",
                "context managers", "the for loop's else clause", "keyword-only arguments")


def write_prompts(records: list[dict], path: Path) -> None:
    """One JSON record per line (the eval sets' format)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")

