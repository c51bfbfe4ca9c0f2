"""The seeded generator and the fault plan.

The generator is the LCG chaos.sh ran in bash arithmetic, kept bit for
bit (signed 64-bit wrap, remainders that keep the dividend's sign), so
that `-s SEED` draws the same faults and victims it always drew.
"""

MASK64 = (1 << 64) - 1


def _s64(x):
    """x wrapped to a signed 64-bit integer, as bash's arithmetic does."""
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def _cmod(a, b):
    """a % b with C's sign rule (the dividend's), as bash's `%`."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def bash_int(text):
    """A decimal-looking word read the way $(( )) reads it: a leading 0
    means octal. Raises ValueError where bash reports an error."""
    if len(text) > 1 and text.startswith("0"):
        return _s64(int(text, 8))
    return _s64(int(text, 10))


class Lcg:
    """RNG = SEED * 2654435761 % 2^31 + 1; then RNG = (RNG * 1103515245
    + 12345) % 2^31 per draw, and a draw in 0..n-1 is (RNG >> 8) % n."""

    def __init__(self, seed):
        self.state = _cmod(_s64(seed * 2654435761), 2147483648) + 1

    def draw(self, n):
        self.state = _cmod(_s64(self.state * 1103515245 + 12345),
                           2147483648)
        return _cmod(self.state >> 8, n)


def make_plan(rng, kinds, faults, quick):
    """FAULTS (kind, r) pairs; r (0..999) picks the victim. Without
    --quick each kind is drawn from KINDS; with it every kind is played
    once per round, in an order shuffled at the round's start."""
    plan = []
    rnd = []
    for i in range(faults):
        if quick:
            if i % len(kinds) == 0:
                rnd = list(kinds)
                for j in range(len(rnd) - 1, 0, -1):
                    x = rng.draw(j + 1)
                    rnd[j], rnd[x] = rnd[x], rnd[j]
            kind = rnd[i % len(kinds)]
        else:
            kind = kinds[rng.draw(len(kinds))]
        plan.append((kind, rng.draw(1000)))
    return plan
