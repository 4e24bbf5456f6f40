"""The synthetic tool domain: six tools with typed arguments, their responses, questions, replies.

Everything a synthetic row holds comes from here, so that a tiny CPU model can learn it:

============== ============================================================ ====================
tool           arguments (type; required unless marked)                    response fields
============== ============================================================ ====================
get_weather    city (string), unit (enum celsius|fahrenheit; optional)      city, temperature,
                                                                            unit, condition
get_time       timezone (string, IANA name such as Asia/Tokyo)              timezone, time, date
convert_       amount (number), from_currency, to_currency (enum of         from, to, rate,
currency       USD EUR GBP JPY CHF CAD)                                     result
get_stock_     symbol (enum of 8 tickers)                                   symbol, price,
price                                                                       currency, change_pct
search_        origin, destination (string), date (string YYYY-MM-DD),      flights, cheapest,
flights        passengers (integer 1-9)                                     airline, departure
translate      text (string), target_language (enum french|spanish|german|  text, translation,
               italian)                                                     language
============== ============================================================ ====================

A response is a deterministic function of the call alone (:func:`respond`): its values are drawn
from a sha256 of the tool name and the canonical JSON of the arguments, never from Python's
salted ``hash()``, so the same call gives the same bytes in every process. One world therefore
holds across rows and splits (the weather in Paris in celsius is the same everywhere).

Each tool also has question templates (a full question, and a short clause for questions that
need two parallel calls) and a reply template that states every fact of its response, which is
what the rubric judge (``judges/rubric.py``) rewards. Texts stay short on purpose: questions of
at most 80 characters, replies of about 40-120.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DOMAIN_VERSION = "synthetic-domain-v1"
"""Bumped whenever a template, a table or a response rule changes (recorded in the manifest)."""

CITY_TIMEZONES: dict[str, str] = {
    "Paris": "Europe/Paris",
    "London": "Europe/London",
    "Berlin": "Europe/Berlin",
    "Rome": "Europe/Rome",
    "Madrid": "Europe/Madrid",
    "Tokyo": "Asia/Tokyo",
    "Dubai": "Asia/Dubai",
    "Singapore": "Asia/Singapore",
    "Sydney": "Australia/Sydney",
    "New York": "America/New_York",
    "Chicago": "America/Chicago",
    "Toronto": "America/Toronto",
}
CITIES = tuple(CITY_TIMEZONES)
UNITS = ("celsius", "fahrenheit")
CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy")
# Units of currency per US dollar: plausible, fixed, so that rates are consistent across rows.
USD_RATES: dict[str, float] = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "JPY": 151.2,
    "CHF": 0.88,
    "CAD": 1.36,
}
CURRENCIES = tuple(USD_RATES)
SYMBOLS = ("AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "TSLA", "META", "IBM")
AIRLINES = ("Air France", "Lufthansa", "Iberia", "Delta", "Emirates", "Qantas")
LANGUAGES = ("french", "spanish", "german", "italian")
# English phrase -> its translation per language, in LANGUAGES order (ASCII on purpose).
PHRASES: dict[str, tuple[str, str, str, str]] = {
    "hello": ("bonjour", "hola", "hallo", "ciao"),
    "thank you": ("merci", "gracias", "danke", "grazie"),
    "good night": ("bonne nuit", "buenas noches", "gute nacht", "buona notte"),
    "see you soon": ("a bientot", "hasta pronto", "bis bald", "a presto"),
    "good morning": ("bonjour", "buenos dias", "guten morgen", "buongiorno"),
    "excuse me": ("excusez-moi", "perdon", "entschuldigung", "scusi"),
    "goodbye": ("au revoir", "adios", "auf wiedersehen", "arrivederci"),
    "please": ("s'il vous plait", "por favor", "bitte", "per favore"),
}

IRRELEVANT_QUESTIONS = (
    "Tell me a joke.",
    "Write a short poem about the sea.",
    "Recommend a good book to read.",
    "How do I boil an egg?",
    "Give me a fun fact about cats.",
    "Suggest a name for my new dog.",
    "Who painted the Mona Lisa?",
    "Explain what gravity is.",
    "Can you write me a birthday message?",
    "What is the meaning of life?",
    "How do I learn to play chess?",
    "Summarize the plot of Hamlet.",
)
"""Questions no tool of the domain can help with (the gold is no call and a polite decline)."""

DECLINES = (
    "Sorry, I can't help with that. My tools cover weather, time, currency, stocks, "
    "flights and translation.",
    "I'm sorry, none of my tools can answer that. I can check weather, time, currency, "
    "stocks, flights or translate.",
)
"""Gold replies of irrelevant rows (no numbers, so the rubric judge finds nothing invented)."""

SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Call tools when needed, then answer briefly."
)
"""The system message of every synthetic row (the tools themselves travel in tool_schemas)."""

PARALLEL_TEMPLATES = ("What's {a} and {b}?", "Tell me {a} and {b}.", "Can you get {a} and {b}?")
"""Questions that need two calls in one turn; ``{a}`` and ``{b}`` are tool clauses."""


@dataclass(frozen=True)
class Tool:
    """One tool of the domain.

    Attributes:
        schema: the OpenAI-style function schema ``{"type": "function", "function": {...}}``.
        sample: draws gold arguments from a seeded generator.
        result: the response object for (valid) arguments and a per-call generator.
        questions: full-question templates, formatted with :attr:`words` of the arguments.
        clause: a short clause for parallel questions, or ``None`` when the tool never pairs.
        reply: the reply sentence stating every fact of a response.

    """

    schema: dict[str, Any]
    sample: Callable[[random.Random], dict[str, Any]]
    result: Callable[[dict[str, Any], random.Random], dict[str, Any]]
    questions: tuple[str, ...]
    clause: str | None
    reply: Callable[[dict[str, Any], dict[str, Any]], str]

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.schema["function"]["name"]


def _schema(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def _str(description: str, enum: tuple[str, ...] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "description": description}
    if enum:
        out["enum"] = list(enum)
    return out


def num(value: float) -> str:
    """A number as its response JSON writes it, so replies quote the response exactly."""
    return json.dumps(value)


def words(arguments: dict[str, Any]) -> dict[str, str]:
    """Template words of gold arguments (``{city}``, ``{Language}``, ``{unit_phrase}`` ...)."""
    out = {k: str(v) for k, v in arguments.items()}
    if "target_language" in arguments:
        out["Language"] = str(arguments["target_language"]).capitalize()
    if "timezone" in arguments:
        out["city"] = next(c for c, tz in CITY_TIMEZONES.items() if tz == arguments["timezone"])
    out["unit_phrase"] = f" in {arguments['unit']}" if "unit" in arguments else ""
    if "passengers" in arguments:
        n = int(arguments["passengers"])
        out["people"] = f"{n} passenger{'s' if n != 1 else ''}"
    return out


# --- the six tools -------------------------------------------------------------------------


def _weather_args(rng: random.Random) -> dict[str, Any]:
    args: dict[str, Any] = {"city": rng.choice(CITIES)}
    if rng.random() < 0.5:  # half the questions name the unit, the others leave the default
        args["unit"] = rng.choice(UNITS)
    return args


def _weather(args: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    unit = args.get("unit", "celsius")
    celsius = rng.uniform(-5.0, 35.0)
    temp = celsius if unit == "celsius" else celsius * 9 / 5 + 32
    return {
        "city": args["city"],
        "temperature": round(temp, 1),
        "unit": unit,
        "condition": rng.choice(CONDITIONS),
    }


def _time(args: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    return {
        "timezone": args["timezone"],
        "time": f"{rng.randrange(24):02d}:{rng.randrange(60):02d}",
        "date": f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
    }


def _currency_args(rng: random.Random) -> dict[str, Any]:
    source, target = rng.sample(CURRENCIES, 2)
    amount: float = rng.choice((5, 10, 20, 25, 50, 75, 100, 120, 200, 250, 500, 1000))
    if rng.random() < 0.25:
        amount = amount + 0.5
    return {"amount": amount, "from_currency": source, "to_currency": target}


def _currency(args: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    rate = round(USD_RATES[args["to_currency"]] / USD_RATES[args["from_currency"]], 4)
    return {
        "from": args["from_currency"],
        "to": args["to_currency"],
        "rate": rate,
        "result": round(float(args["amount"]) * rate, 2),
    }


def _stock(args: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    change = round(rng.uniform(0.1, 3.0), 1) * rng.choice((-1, 1))
    return {
        "symbol": args["symbol"],
        "price": round(rng.uniform(20.0, 900.0), 2),
        "currency": "USD",
        "change_pct": change,
    }


def _stock_reply(args: dict[str, Any], r: dict[str, Any]) -> str:
    move = "up" if r["change_pct"] > 0 else "down"
    return (
        f"{r['symbol']} trades at {num(r['price'])} {r['currency']}, "
        f"{move} {num(abs(r['change_pct']))}% today."
    )


def _flights_args(rng: random.Random) -> dict[str, Any]:
    origin, destination = rng.sample(CITIES, 2)
    return {
        "origin": origin,
        "destination": destination,
        "date": f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        "passengers": rng.randrange(1, 5),
    }


def _flights(args: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    return {
        "flights": rng.randrange(2, 10),
        "cheapest": rng.randrange(60, 900) * int(args["passengers"]),
        "airline": rng.choice(AIRLINES),
        "departure": f"{rng.randrange(5, 23):02d}:{rng.choice((0, 15, 30, 45)):02d}",
    }


def _translate(args: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    language = str(args["target_language"]).lower()
    table = PHRASES.get(str(args["text"]).strip().lower())
    translation = table[LANGUAGES.index(language)] if table and language in LANGUAGES else ""
    return {"text": args["text"], "translation": translation, "language": language}


TOOLS: tuple[Tool, ...] = (
    Tool(
        _schema(
            "get_weather",
            "Current weather in a city.",
            {"city": _str("city name, e.g. Paris"), "unit": _str("temperature unit", UNITS)},
            ["city"],
        ),
        _weather_args,
        _weather,
        (
            "What's the weather in {city}{unit_phrase}?",
            "How is the weather in {city} today{unit_phrase}?",
            "Check the weather in {city}{unit_phrase}, please.",
        ),
        "the weather in {city}{unit_phrase}",
        lambda a, r: (
            f"It is {num(r['temperature'])} degrees {r['unit']} and {r['condition']} "
            f"in {r['city']}."
        ),
    ),
    Tool(
        _schema(
            "get_time",
            "Current local time and date in a timezone.",
            {"timezone": _str("IANA timezone, e.g. Asia/Tokyo")},
            ["timezone"],
        ),
        lambda rng: {"timezone": CITY_TIMEZONES[rng.choice(CITIES)]},
        _time,
        (
            "What time is it in {city}?",
            "What's the current time in {city}?",
            "Tell me the local time in {city}.",
        ),
        "the time in {city}",
        lambda a, r: f"It is {r['time']} on {r['date']} in {r['timezone']}.",
    ),
    Tool(
        _schema(
            "convert_currency",
            "Convert an amount of money between currencies.",
            {
                "amount": {"type": "number", "description": "amount to convert"},
                "from_currency": _str("currency code to convert from", CURRENCIES),
                "to_currency": _str("currency code to convert to", CURRENCIES),
            },
            ["amount", "from_currency", "to_currency"],
        ),
        _currency_args,
        _currency,
        (
            "Convert {amount} {from_currency} to {to_currency}.",
            "How much is {amount} {from_currency} in {to_currency}?",
            "What is {amount} {from_currency} in {to_currency}?",
        ),
        "{amount} {from_currency} in {to_currency}",
        lambda a, r: (
            f"{num(a['amount'])} {r['from']} is {num(r['result'])} {r['to']} "
            f"at a rate of {num(r['rate'])}."
        ),
    ),
    Tool(
        _schema(
            "get_stock_price",
            "Latest share price of a stock.",
            {"symbol": _str("ticker symbol", SYMBOLS)},
            ["symbol"],
        ),
        lambda rng: {"symbol": rng.choice(SYMBOLS)},
        _stock,
        (
            "What's the stock price of {symbol}?",
            "How is {symbol} stock doing today?",
            "Get me the share price of {symbol}.",
        ),
        "the stock price of {symbol}",
        _stock_reply,
    ),
    Tool(
        _schema(
            "search_flights",
            "Search flights between two cities on a date.",
            {
                "origin": _str("departure city"),
                "destination": _str("arrival city"),
                "date": _str("travel date, YYYY-MM-DD"),
                "passengers": {"type": "integer", "description": "number of passengers"},
            },
            ["origin", "destination", "date", "passengers"],
        ),
        _flights_args,
        _flights,
        (
            "Find flights from {origin} to {destination} on {date} for {people}.",
            "Search flights {origin} to {destination} on {date}, {people}.",
        ),
        None,  # too long a clause to pair within 80 characters
        lambda a, r: (
            f"Cheapest of {r['flights']} flights: {r['airline']} at {r['departure']} "
            f"for {r['cheapest']} USD."
        ),
    ),
    Tool(
        _schema(
            "translate",
            "Translate a short English text.",
            {"text": _str("text to translate"), "target_language": _str("language", LANGUAGES)},
            ["text", "target_language"],
        ),
        lambda rng: {"text": rng.choice(tuple(PHRASES)), "target_language": rng.choice(LANGUAGES)},
        _translate,
        ('Translate "{text}" into {Language}.', 'How do you say "{text}" in {Language}?'),
        '"{text}" in {Language}',
        lambda a, r: f'In {r["language"].capitalize()}, "{r["text"]}" is "{r["translation"]}".',
    ),
)
"""The domain's tools, in a fixed order (their schemas are every row's ``tool_schemas``)."""

TOOLS_BY_NAME: dict[str, Tool] = {tool.name: tool for tool in TOOLS}
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS_BY_NAME)
TOOL_SCHEMAS: list[dict[str, Any]] = [tool.schema for tool in TOOLS]


def call_rng(name: str, arguments: dict[str, Any]) -> random.Random:
    """The generator a call's response is drawn from: seeded by sha256 of the call."""
    key = json.dumps([DOMAIN_VERSION, name, arguments], sort_keys=True, separators=(",", ":"))
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def respond(name: str, arguments: dict[str, Any]) -> str:
    """The tool response (compact JSON) to a gold call of the domain.

    >>> respond("get_stock_price", {"symbol": "IBM"})
    '{"symbol": "IBM", "price": 592.11, "currency": "USD", "change_pct": -2.8}'

    Raises:
        KeyError: ``name`` is not a tool of the domain.

    """
    result = TOOLS_BY_NAME[name].result(arguments, call_rng(name, arguments))
    return json.dumps(result, ensure_ascii=False, separators=(", ", ": "))


def reply(name: str, arguments: dict[str, Any], content: str) -> str:
    """The gold reply sentence for one call and its response."""
    return TOOLS_BY_NAME[name].reply(arguments, json.loads(content))
