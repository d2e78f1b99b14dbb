"""Write deploy/data/prompts.json: deployctl's built-in benchmark prompt set (ShareGPT format).

Written by the deployctl team (no third-party text): chat, code, math and summarisation prompts,
each a two-turn conversation (human, gpt) as ``sglang.bench_serving --dataset-name sharegpt``
reads it (the first two turns; the gpt turn only sets the output length when
``--sharegpt-output-len`` is not given, and deployctl always gives it). verify-acceptance draws
its prompts from the same file. Deterministic: run it again and the file (and its sha256, which
every benchmark record names) does not change unless this script does.

    python3 contrib/make_builtin_prompts.py
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TOPICS = [
    "why the sky is blue", "how a refrigerator keeps food cold", "what causes the seasons",
    "how vaccines train the immune system", "why bread rises", "how tides work",
    "what a mortgage is", "how airplanes stay in the air", "why cats purr",
    "how noise-cancelling headphones work", "what inflation means for savings",
    "how a bill becomes law in a parliament", "why leaves change colour in autumn",
    "how GPS finds your position", "what makes a good night's sleep", "how coffee is decaffeinated",
    "why the ocean is salty", "how electric cars charge", "what a black hole is",
    "how to start learning a new language",
]
CHAT_STYLES = [
    "Explain {t} to a ten-year-old.",
    "In three short paragraphs, explain {t}.",
    "A friend asked me {t}. Give me a clear answer I can repeat to them.",
    "What are the most common misconceptions about {t}? Correct each one.",
]

CODE_TASKS = [
    ("Python", "returns the n-th Fibonacci number iteratively"),
    ("Python", "parses an ISO 8601 date string and returns the weekday"),
    ("Python", "merges two sorted lists into one sorted list"),
    ("Python", "counts word frequencies in a text file and prints the top ten"),
    ("Python", "validates an IPv4 address without using the ipaddress module"),
    ("Rust", "reverses the words in a sentence"),
    ("Rust", "computes the greatest common divisor of two integers"),
    ("Go", "reads a CSV file and sums the second column"),
    ("Go", "implements a thread-safe counter"),
    ("JavaScript", "debounces another function"),
    ("JavaScript", "deep-clones a plain object without JSON.stringify"),
    ("C", "checks whether a string is a palindrome"),
    ("C", "implements binary search over an int array"),
    ("SQL", "finds the three customers with the highest total order value"),
    ("Bash", "renames every .jpeg file in a directory to .jpg"),
    ("TypeScript", "groups an array of records by a key"),
    ("Python", "implements an LRU cache with a fixed capacity"),
    ("Java", "checks whether two strings are anagrams"),
    ("Python", "flattens an arbitrarily nested list"),
    ("C++", "removes duplicates from a vector while keeping order"),
]
CODE_STYLES = [
    "Write a {lang} function that {task}. Include a short docstring or comment.",
    "Write a {lang} function that {task}, then explain its time complexity.",
    "Here is my task: a {lang} function that {task}. Write it and add two unit tests.",
    "Review this plan: I want a {lang} function that {task}. Point out edge cases, then write it.",
]

MATH = [
    "What is {a} multiplied by {b}? Show the steps.",
    "Solve for x: {a}x + {b} = {c}. Explain each step.",
    "A train travels {a} km in {b} hours. What is its average speed in km/h, and how far does it go in {c} hours?",
    "What is the sum of all integers from 1 to {a}? Explain the formula you use.",
    "A shop sells pens at {b} cents each. How many pens can I buy with {c} dollars, and how much change is left?",
    "Is {a} a prime number? Explain how you checked.",
    "Find the area and perimeter of a rectangle {a} cm by {b} cm.",
    "Convert {a} degrees Fahrenheit to Celsius, showing the formula.",
]
MATH_NUMBERS = [(17, 23, 90), (48, 12, 7), (125, 4, 13), (91, 7, 3), (360, 15, 22), (73, 9, 40),
                (1001, 11, 5), (64, 8, 31), (250, 6, 18), (19, 3, 57)]

PASSAGES = [
    "The town council met on Tuesday to discuss the new cycling lanes. Shop owners on the high street worried that "
    "removing parking spaces would cost them customers, while parents argued that safer lanes would let children "
    "cycle to school. After two hours the council agreed to a six-month trial on one street, with footfall counted "
    "before and after.",
    "Our team moved the nightly build from a single large machine to four smaller ones. Builds now finish in 22 "
    "minutes instead of 51, but two flaky tests that depended on file ordering started failing. We fixed the tests "
    "by sorting directory listings and added a check that runs them in random order.",
    "Honeybees communicate the location of food with a waggle dance. The angle of the dance relative to vertical "
    "shows the direction of the food relative to the sun, and the length of the waggle run shows the distance. "
    "Other bees follow the dancer and then fly out to find the flowers themselves.",
    "The library will close for renovation from March to June. During that time books can be returned at the "
    "community centre, and the online catalogue and e-book lending stay available. The children's reading club "
    "will meet in the school hall on Saturdays.",
    "A hospital study compared two reminder systems for patients taking daily medication. Text reminders improved "
    "adherence by 9 percent over six months, while a pill box with a light improved it by 14 percent. Patients over "
    "seventy preferred the pill box; younger patients preferred the texts.",
    "The company's third-quarter revenue grew 6 percent, driven by subscriptions, while hardware sales fell for the "
    "second quarter in a row. Management plans to cut two product lines, invest in support staff, and expects "
    "margins to improve next year.",
    "Glaciers in the region lost about a fifth of their volume over the last two decades. Researchers combined "
    "satellite images with field measurements and found that the loss accelerated after 2015, mostly because of "
    "warmer summers rather than less snowfall.",
    "The outage began when a configuration change doubled the number of connections each web server opened to the "
    "database. The database hit its connection limit, requests queued, and health checks failed. Rolling back the "
    "change restored service after 38 minutes; a limit check now runs before deploys.",
    "Volunteers planted four hundred trees along the river this spring. Each tree has a tag with its species and "
    "planting date, and a school class will measure their growth every autumn. The project hopes to reduce bank "
    "erosion and give shade to the footpath.",
    "The new train timetable adds an early service at 5:40 and removes two late-evening trains that carried few "
    "passengers. Weekend trains will run every thirty minutes instead of every hour. Fares do not change.",
    "A small bakery switched from paper order slips to a tablet app. Mistakes in orders dropped, but the staff found "
    "the app slow during the morning rush, so they kept one paper pad for walk-in customers and use the app for "
    "phone and online orders.",
    "The museum's new exhibition shows tools from the Bronze Age found during a road construction project. Visitors "
    "can handle replicas of an axe and a sickle, and a short film explains how archaeologists dated the objects "
    "using the layers of soil around them.",
]
SUMMARY_STYLES = [
    "Summarise the following text in one sentence:\n\n{p}",
    "Summarise the following for a busy manager, as three bullet points:\n\n{p}",
    "What is the main point of this text, and what decision or result does it report?\n\n{p}",
    "Write a short headline and a two-sentence summary for this text:\n\n{p}",
    "List the facts and numbers in this text, then summarise it in plain words:\n\n{p}",
]


def reply(kind: str, prompt: str) -> str:
    """A short stand-in answer: only its presence matters (bench_serving needs two turns)."""
    first = prompt.splitlines()[0]
    return {"chat": "Here is a clear explanation. ", "code": "Here is an implementation with notes. ",
            "math": "Let us work through it step by step. ", "summary": "Summary: "}[kind] + \
        f"(answer to: {first[:80]})"


def records() -> list[dict]:
    out: list[tuple[str, str]] = []
    out += [("chat", style.format(t=t)) for t in CHAT_TOPICS for style in CHAT_STYLES]
    out += [("code", style.format(lang=lang, task=task)) for lang, task in CODE_TASKS for style in CODE_STYLES]
    out += [("math", m.format(a=a, b=b, c=c)) for a, b, c in MATH_NUMBERS for m in MATH]
    out += [("summary", style.format(p=p)) for p in PASSAGES for style in SUMMARY_STYLES]
    # interleave the kinds so that the first N prompts (verify-acceptance's) cover all four
    by_kind: dict[str, list[str]] = {}
    for kind, prompt in out:
        by_kind.setdefault(kind, []).append(prompt)
    mixed: list[dict] = []
    index = 0
    while any(by_kind.values()):
        for kind in ("chat", "code", "math", "summary"):
            if by_kind.get(kind):
                prompt = by_kind[kind].pop(0)
                mixed.append({"id": f"deployctl-{kind}-{index:03d}", "category": kind,
                              "conversations": [{"from": "human", "value": prompt},
                                                {"from": "gpt", "value": reply(kind, prompt)}]})
                index += 1
    return mixed


def main() -> None:
    target = Path(__file__).resolve().parent.parent / "deploy" / "data" / "prompts.json"
    target.write_text(json.dumps(records(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{target}: {len(records())} prompts")


if __name__ == "__main__":
    main()
