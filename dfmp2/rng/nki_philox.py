"""Philox4x32-10 on a NeuronCore (NKI): the words of `philox.random_words`, bit for bit.

Tiles and layout: one program makes T tiles of 128 x F counter blocks (F <= 512 per partition,
`FREE`; T at most MAX_TILES a launch): block b = first + (g 128 + p) T F + t F + f on program g (a
physical core of the launch grid), partition p, tile t, free index f, of stream `stream` under key
(k0, k1); the output [G 128, T F 16] uint8 in HBM holds each block's four words as little-endian
bytes, so that its bytes are the host's uint32 words [G 128 T F, 4] in block order.

Arithmetic: NKI's Vector and Scalar engines carry integers through fp32, exact below 2^24 only
(docs/nki-facts.md, "Integers and random numbers"), so each 32-bit word is four 8-bit limbs, one
int32 [128, F] tile each, and no intermediate reaches 2^24 on any engine or release:
    counter      c0, c1 = block mod 2^32, block div 2^32 (limbs of p F + f from nisa.iota, plus
                 the limbs of `first` with carries);  c2 = stream;  c3 = 0
    multiply     m x = sum_k 2^(8k) S_k,  S_k = sum_(i+j=k) m_i x_j <= 4 * 255^2 < 2^18 (m_i: the
                 constant's bytes, scalar operands); then limb_k = t & 255, carry = t >> 8 over
                 t = S_k + carry: (m x) mod 2^32 = limbs 0-3, (m x) div 2^32 = limbs 4-7
    round        (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))
    key          k0 += W0, k1 += W1 (mod 2^32) between rounds, on the host (`counter_columns`): the
                 counter, stream and keys are a small run-time argument, so one specialization (one
                 compile on a Trainium host) serves every seed, stream and start
Products and sums are fp32 instructions on int32 tiles (exact: < 2^24); & and >> are bitvec
instructions on values < 2^24, exact whether the engine reads bit patterns (AWS's operator table)
or carries them through fp32 (AWS's answer in aws-neuron-sdk #1308): the emulator takes the latter.

Loaded like kernels/nki/kernels.py: as is on a Trainium host (the real `nki`), or from its file with
dfmp2's emulator standing in (`kernels.nki.launch.load_kernel_file`).
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128  # partitions
FREE = 512  # blocks per partition per tile at most (one [128, 512] int32 tile per limb: 2 KiB a partition)
MAX_TILES = 64  # tiles per launch at most (~1,100 instructions each; 128 x 64 x 512 < 2^24 keeps iota's p T F + f exact)
PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # multipliers of words 0 and 2 (Random123)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # the key's bump between rounds (Random123)
ROUNDS = 10
MASK32 = 0xFFFFFFFF


def byte_limbs(value, count=4):
    """The `count` 8-bit limbs of a non-negative int, least significant first."""
    return tuple((value >> (8 * k)) & 255 for k in range(count))


def _tile(blocks):
    return nl.ndarray((P, blocks), dtype=nl.int32, buffer=nl.sbuf)


def _constant(blocks, value):
    """A [P, F] int32 tile holding `value` (< 256) everywhere."""
    tile = _tile(blocks)
    nisa.memset(dst=tile, value=value)
    return tile


def _carry_chain(columns, blocks):
    """Limbs of sum_k 2^(8k) columns[k] (int32 tiles, each < 2^18): limb_k = t & 255, carry =
    t >> 8 over t = columns[k] + carry; len(columns) + 1 limbs, the last the final carry."""
    limbs, carry = [], None
    for column in columns:
        if carry is None:
            total = column
        else:
            total = _tile(blocks)
            nisa.tensor_tensor(dst=total, data1=column, data2=carry, op=nl.add)
        limb = _tile(blocks)
        nisa.tensor_scalar(dst=limb, data=total, op0=nl.bitwise_and, operand0=255)
        carry = _tile(blocks)
        nisa.tensor_scalar(dst=carry, data=total, op0=nl.right_shift, operand0=8)
        limbs.append(limb)
    limbs.append(carry)
    return limbs


def _mulhilo(multiplier, x, blocks):
    """(hi, lo) limbs of multiplier * x for a constant multiplier < 2^32 and x four limb tiles:
    column sums of the limb products (fp32, exact), then the carry chain."""
    m = byte_limbs(multiplier)
    columns = []
    for k in range(7):
        column = None
        for i in range(4):
            j = k - i
            if j < 0 or j > 3 or m[i] == 0:
                continue
            product = _tile(blocks)  # m_i x_j <= 255^2
            nisa.tensor_scalar(dst=product, data=x[j], op0=nl.multiply, operand0=float(m[i]))
            if column is None:
                column = product
            else:
                total = _tile(blocks)
                nisa.tensor_tensor(dst=total, data1=column, data2=product, op=nl.add)
                column = total
        columns.append(column if column is not None else _constant(blocks, 0))
    limbs = _carry_chain(columns, blocks)
    return limbs[4:8], limbs[0:4]


def _xor_word(a, b, key, blocks):
    """a ^ b ^ key limb by limb: a, b four limb tiles, key four [P, 1] int32 tiles (its limbs)."""
    out = []
    for k in range(4):
        limb = _tile(blocks)
        nisa.tensor_tensor(dst=limb, data1=a[k], data2=b[k], op=nl.bitwise_xor)
        keyed = _tile(blocks)
        nisa.tensor_scalar(dst=keyed, data=limb, op0=nl.bitwise_xor, operand0=key[k])
        out.append(keyed)
    return out


def _from_zero(zero, limb, blocks):
    """A [P, F] int32 tile holding limb ([P, 1] fp32 tile) everywhere: zero + limb."""
    tile = _tile(blocks)
    nisa.tensor_scalar(dst=tile, data=zero, op0=nl.add, operand0=limb)
    return tile


def _block_counter(first, local, zero, blocks):
    """(c0, c1) limbs of block = first + local: local (an int32 tile < 2^24, from iota) in three
    limbs, plus first's eight limbs (each a [P, 1] fp32 tile), with carries."""
    columns = []
    for k in range(8):
        if k < 3:
            part = _tile(blocks)
            if k == 0:
                nisa.tensor_scalar(dst=part, data=local, op0=nl.bitwise_and, operand0=255)
            else:
                nisa.tensor_scalar(dst=part, data=local, op0=nl.right_shift, operand0=8 * k,
                                   op1=nl.bitwise_and, operand1=255)
            total = _tile(blocks)
            nisa.tensor_scalar(dst=total, data=part, op0=nl.add, operand0=first[k])
            columns.append(total)
        else:
            columns.append(_from_zero(zero, first[k], blocks))
    limbs = _carry_chain(columns, blocks)  # the ninth limb (block >= 2^64) is dropped
    return limbs[0:4], limbs[4:8]


def _philox_tile(local, zero, first, stream, keys, blocks):
    """The four words (limb tiles) of blocks first + local under (stream, keys): Philox's ten
    rounds; first (8 limbs) and stream (4) as [P, 1] fp32 tiles, keys[r] = (k0 limbs, k1 limbs) of
    round r as [P, 1] int32 tiles."""
    c0, c1 = _block_counter(first, local, zero, blocks)
    c2 = [_from_zero(zero, limb, blocks) for limb in stream]
    c3 = [zero, zero, zero, zero]
    for r in range(ROUNDS):
        hi0, lo0 = _mulhilo(PHILOX_M[0], c0, blocks)
        hi1, lo1 = _mulhilo(PHILOX_M[1], c2, blocks)
        c0, c1, c2, c3 = _xor_word(hi1, c1, keys[r][0], blocks), lo1, _xor_word(hi0, c3, keys[r][1], blocks), lo0
    return c0, c1, c2, c3


@nki.jit
def philox_kernel(counters, blocks, tiles):
    """Philox4x32-10 words of blocks [first, first + G 128 T F) of a stream on a grid of G programs
    (the physical cores of a logical NeuronCore), T tiles of F = `blocks` blocks per partition
    (partition p of program g: blocks first_g + p T F + [0, T F), first_g = first + g 128 T F).
    counters [G 128, COLUMNS] int32 (`counter_columns`: per program's rows, first_g's 8 limbs,
    the stream's 4 and each round's key limbs, the same on every partition): the run-time inputs,
    so that one specialization serves every seed, stream and start. -> [G 128, T F 16] uint8
    (shared HBM), each block's words as little-endian bytes. blocks <= FREE, tiles <= MAX_TILES:
    compile-time constants."""
    if blocks > FREE or tiles > MAX_TILES or P * tiles * blocks > 1 << 24:
        raise ValueError(f"philox_kernel: F = {blocks} <= {FREE}, T = {tiles} <= {MAX_TILES} (iota's p T F + f "
                         "must stay below 2^24)")
    programs, pid = nl.num_programs(), nl.program_id(0)
    run = tiles * blocks  # blocks per partition
    out = nl.ndarray((programs * P, run * 16), dtype=nl.uint8, buffer=nl.shared_hbm)
    limbs = nl.ndarray((P, COLUMNS), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=limbs, src=counters[pid * P:(pid + 1) * P])
    limbs32 = nl.ndarray((P, COLUMNS), dtype=nl.float32, buffer=nl.sbuf)  # the arithmetic operands
    nisa.tensor_copy(dst=limbs32, src=limbs)
    first = [limbs32[:, k:k + 1] for k in range(8)]
    stream = [limbs32[:, 8 + k:9 + k] for k in range(4)]
    keys = [tuple([limbs[:, 12 + 8 * r + 4 * w + k:13 + 8 * r + 4 * w + k] for k in range(4)] for w in range(2))
            for r in range(ROUNDS)]
    zero = _tile(blocks)
    nisa.memset(dst=zero, value=0)
    for t in range(tiles):
        local = _tile(blocks)  # p T F + t F + f < 2^24
        nisa.iota(dst=local, pattern=[[1, blocks]], offset=t * blocks, channel_multiplier=run)
        words = _philox_tile(local, zero, first, stream, keys, blocks)
        packed = nl.ndarray((P, blocks, 16), dtype=nl.uint8, buffer=nl.sbuf)
        for w in range(4):
            for k in range(4):
                nisa.tensor_copy(dst=packed[:, :, 4 * w + k], src=words[w][k])
        nisa.dma_copy(dst=out[pid * P:(pid + 1) * P, t * blocks * 16:(t + 1) * blocks * 16],
                      src=packed.reshape((P, blocks * 16)))
    return out


COLUMNS = 12 + 8 * ROUNDS  # first (8 limbs), stream (4), then per round k0 (4) and k1 (4)


def counter_columns(first, stream, key0, key1, programs, run):
    """philox_kernel's counters: [programs 128, COLUMNS] int32, program g's rows holding the limbs of
    first + g 128 run (mod 2^64), the stream, and each round's key (k0 + r W0, k1 + r W1 mod 2^32),
    the same on every partition (host work at launch: a few hundred integers)."""
    rows = []
    for g in range(programs):
        row = list(byte_limbs((first + g * P * run) % (1 << 64), 8)) + list(byte_limbs(stream))
        for r in range(ROUNDS):
            row += list(byte_limbs((key0 + r * PHILOX_W[0]) & MASK32))
            row += list(byte_limbs((key1 + r * PHILOX_W[1]) & MASK32))
        rows += [row] * P
    return rows
