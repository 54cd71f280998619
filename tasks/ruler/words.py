"""Word lists for RULER's word-type needle keys and values.

RULER draws ``adjective-noun`` pairs from the ``wonderwords`` package's lists. These are our
own, shorter lists of common English words, so the task needs no extra dependency; the key
space (adjectives x nouns) is still large enough that two draws in one example rarely
collide, and the synthesis rejects the collisions that would make an example ambiguous.
"""

from __future__ import annotations

_ADJECTIVES = """
able absent abstract abundant accurate active actual adorable adventurous afraid aggressive
agile alert alive amazing ambitious ancient angry annual anxious apparent arctic arid
aromatic artistic ashamed asleep athletic attractive automatic available average awake
aware awesome awful awkward bad bald bare basic beautiful bent best better big bitter
black bland blank blind blond blue blunt bold boring bouncy brave brief bright brilliant
brisk broad broken bronze brown bumpy busy calm capable careful careless casual cautious
central certain charming cheap cheerful chemical chief chilly chubby civil classic clean
clear clever close cloudy clumsy coastal cold colorful comfortable common complete complex
confident constant cool correct cosmic costly cozy crazy creamy creative crisp crooked
crowded cruel crunchy cuddly curious curly current curved cute daily damp dark dear
decent deep defiant delicate delicious dense desert determined different difficult
digital direct dirty distant divine dizzy double dramatic dreamy dry dull dusty eager
early earnest easy eastern elastic electric elegant elite empty endless energetic enormous
entire equal eternal even evil exact excellent exotic expensive expert faint fair
faithful famous fancy fast fearless feeble fertile few fierce filthy final fine firm
flat flexible fluffy fluid foggy foolish formal fragile frank free frequent fresh
friendly frozen full funny fuzzy gentle genuine giant gifted glad global glossy golden
good gorgeous graceful grand grateful gray great green grumpy guilty handsome happy
hard harsh healthy heavy helpful hidden high hollow holy honest hopeful horrible hot
huge humble hungry icy ideal idle illegal immense important innocent intense internal
jolly joyful juicy junior keen kind large late lazy lean legal light likely linear
little lively local lonely long loose loud lovely loyal lucky lunar magic main major
massive mature meek mellow merry mighty mild minor misty modern modest moist narrow
nasty native natural neat nervous new nice noble noisy normal nosy numb odd official
old open orange ordinary organic outer painful pale patient peaceful perfect personal
plain pleasant plump polite poor popular portable positive precious pretty primary
private proud public pure purple quick quiet rapid rare raw ready real recent red
regular remote rich rigid ripe robust rough round royal rude rural rusty sacred sad
safe salty scarce secret secure selfish serious shallow sharp shiny short shy silent
silky silly silver simple sincere single skinny sleepy slim slow small smart smooth
snowy social soft solar solid sour spare special spicy splendid square stable steady
steep sticky stiff still stormy straight strange strict strong stubborn sturdy sudden
sunny super sweet swift tall tame tart tender tense thick thin thirsty tidy tight
tiny tired tough tranquil tropical true twin ugly unique upper urban useful vague
valid vast velvet violet visible vital vivid warm wary weak wealthy weary wet white
whole wide wild windy wise witty wooden woolly worried yellow young zealous
"""

_NOUNS = """
account acorn actor airport album anchor angle animal ankle answer apple apron arch
archer area arm army arrow artist attic aunt autumn avenue baby badge bag bakery
balance ball balloon banana band bank barn basket bath battery beach beam bean bear
beard bed bee beetle bell belt bench berry bicycle bird biscuit blade blanket block
boat body bone book boot bottle boulder bowl box branch bread breeze brick bridge
brother brush bubble bucket building bull bus bush butter button cabin cable cake
camel camera camp canal candle canoe canyon cap captain car card carpet carrot castle
cat cave ceiling cellar chain chair chalk channel cheese cherry chicken child chimney
church circle city clock cloud coach coast coat coffee coin comet copper corn corner
cotton country cousin cow crab crayon cream creek crow crown cup curtain cushion
daisy dancer desk diamond dinner doctor dog doll dolphin door dragon drawer dream
dress drum duck eagle ear earth egg elbow elephant engine eye fabric face factory
falcon farm farmer feather fence field finger fire fish flag flame flower flute fog
folder forest fork fountain fox frog fruit garden garlic gate ghost gift giraffe
glass glove goat gold grape grass guitar hall hammer hand harbor hat hawk heart
hedge helmet hill honey hook horse hospital hotel house island jacket jar jelly
jewel judge kettle key king kitchen kite kitten knee knife ladder lake lamp lantern
leaf lemon letter library lion lizard lock machine magnet map marble market meadow
melon mirror monkey moon mountain mouse muffin museum nail napkin needle nest net
night notebook ocean office onion orchard otter owl oyster paddle painter palace
pan panda paper parrot path peach pear pebble pen pencil pepper piano pickle picture
pie pig pillow pilot pine planet plate pocket poem pond potato pumpkin puppy queen
rabbit radio rain rainbow raven ribbon river road robin rock roof room rope rose
saddle sail salad sand scarf school scissors sea seed shadow sheep shelf shell ship
shirt shoe shovel singer sister skirt sky snake snow soap sock sofa soldier song
soup spider spoon spring square squirrel stable star station stone storm stove
stream street string sugar summer sun swan sweater table tail teacher teapot tent
thread throne thunder ticket tiger toast tomato tooth tower town toy tractor train
tree truck trumpet tulip tunnel turtle umbrella valley vase village violin volcano
wagon wall wallet walnut water wave whale wheel whistle window wing winter wizard
wolf wood worm yard zebra
"""

ADJECTIVES: tuple[str, ...] = tuple(sorted(set(_ADJECTIVES.split())))
NOUNS: tuple[str, ...] = tuple(sorted(set(_NOUNS.split())))
