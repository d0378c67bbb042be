"""Word lists the synthetic tasks draw keys, values and filler from.

Every word here is a single whole word (no punctuation), so a word-level tokenizer
built from these lists and the task templates covers every prompt the generators can
produce. Real tokenizers need nothing from this module.
"""

from __future__ import annotations

# Needle keys (RULER draws random English words as keys).
NEEDLE_KEYS: tuple[str, ...] = tuple(
    """
    apple anchor arrow autumn badge bamboo banner barrel basket beacon bottle bridge
    bucket butter cabin camera candle canyon carpet castle cedar chalk cherry circle
    cliff clock cloud comet copper coral cotton crown crystal curtain dagger desert
    diamond dolphin dragon drum eagle ember falcon feather fiber forest fossil fountain
    galaxy garden garlic glacier glove granite harbor harvest hammer helmet honey
    horizon island ivory jacket jasmine jungle kettle kingdom ladder lantern lemon
    lizard magnet maple marble meadow mirror monkey mountain needle nickel noodle
    ocean orbit orchid oyster paddle palace panther parrot pebble pepper piano pillow
    pirate planet pocket puzzle quartz rabbit radar rainbow raven ribbon river rocket
    saddle salmon sapphire scarf shadow shell silver spider spiral sponge squirrel
    stone storm sugar summit sunset sword tablet temple thunder tiger timber tomato
    tower trumpet tulip tunnel turtle umbrella valley velvet violin volcano wagon
    walnut whale whistle willow window winter wizard wolf yacht zebra zipper
    """.split()
)

# Multi-key QA: people and the attributes stated about them.
PEOPLE: tuple[str, ...] = tuple(
    """
    Adam Alice Amelia Arthur Benjamin Bella Caleb Chloe Daniel Diana Edward Elena
    Felix Fiona George Grace Henry Hannah Isaac Iris Jacob Julia Kevin Laura Leo
    Lucy Martin Maria Nathan Nora Oliver Olivia Patrick Paula Quentin Rachel Samuel
    Sarah Thomas Tessa Victor Vera Walter Wendy Xavier Yara Zachary Zoe Aaron Bianca
    Carlos Delia Ethan Freya Gavin Helena Ivan Jasmine Kenneth Lydia Marcus Naomi
    Oscar Priya Ruben Sofia Tobias Ursula Vincent Willa
    """.split()
)
CITIES: tuple[str, ...] = tuple(
    """
    Paris London Berlin Madrid Rome Vienna Prague Lisbon Dublin Oslo Stockholm Helsinki
    Warsaw Athens Cairo Nairobi Lagos Tokyo Seoul Beijing Shanghai Mumbai Delhi Bangkok
    Sydney Melbourne Auckland Toronto Montreal Chicago Boston Denver Seattle Houston
    Miami Lima Bogota Santiago Havana Istanbul Moscow Kyiv Budapest Zurich Geneva
    Munich Hamburg Amsterdam Brussels
    """.split()
)
JOBS: tuple[str, ...] = tuple(
    """
    baker teacher doctor lawyer pilot nurse farmer painter writer singer dancer plumber
    carpenter dentist banker chef driver gardener tailor sailor soldier judge manager
    mechanic musician photographer pharmacist librarian cashier waiter surgeon
    scientist poet butcher florist jeweler potter sculptor translator veterinarian
    """.split()
)
COLORS: tuple[str, ...] = tuple(
    "red blue green yellow purple orange pink brown black white gray silver gold teal maroon navy".split()
)
PETS: tuple[str, ...] = tuple(
    """
    cat dog parrot hamster rabbit turtle goldfish ferret lizard snake canary pony
    goat pig mouse frog hedgehog chinchilla tortoise iguana
    """.split()
)
INSTRUMENTS: tuple[str, ...] = tuple(
    """
    piano violin guitar cello flute trumpet drums harp clarinet saxophone trombone
    banjo accordion oboe ukulele mandolin harmonica bassoon
    """.split()
)

# Multi-turn recall: the things whose codes the user asks the assistant to remember.
CODE_ITEMS: tuple[str, ...] = tuple(
    """
    locker garage office gym bike safe alarm storage mailbox suitcase cabinet gate
    basement laptop phone door vault warehouse studio shed
    """.split()
)

TOPICS: tuple[str, ...] = tuple(
    """
    history cooking gardening travel music painting photography astronomy chemistry
    poetry football chess hiking cycling baking fishing sailing knitting architecture
    economics
    """.split()
)
FOODS: tuple[str, ...] = tuple(
    "pasta soup salad rice bread curry pizza stew omelette pancakes noodles chicken".split()
)
WEEKDAYS: tuple[str, ...] = tuple(
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
)

# Look-alike needle keys: RULER's word keys are "adjective-noun" pairs (wonderwords'
# adjective and noun lists); here adjectives from this list with the needle keys above
# as nouns.
KEY_ADJECTIVES: tuple[str, ...] = tuple(
    """
    ancient angry bitter brave bright broken calm clever cold crooked curious dark
    eager empty fancy fierce gentle giant glossy golden grumpy hidden hollow humble
    icy jolly lazy little lonely loud lucky merry misty modest noisy odd pale polite
    proud quiet rapid rough royal rusty shiny shy silent sleepy slow smooth snowy
    sour spotted steady sticky stormy strange sunny swift tall tiny wild wise wooden
    """.split()
)
