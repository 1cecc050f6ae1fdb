#include "format/utf8.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CES_UTF8_VECTOR 1
#include <tmmintrin.h>
#endif

#define HIGH_BITS 0x8080808080808080ULL

/* The well-formed sequences are those of the Unicode standard's table 3-7: a lead byte C2-F4, then
 * continuation bytes 80-BF, except that the second byte's range is narrower after E0 (no overlong
 * forms), ED (no surrogates), F0 (no overlong forms) and F4 (nothing past U+10FFFF). */
size_t ces_utf8_check_scalar(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        /* ASCII, the common case: 32 bytes at a time (four words, one test), then eight, going
         * straight to the first byte that is not ASCII. */
        while (len - i >= 32) {
            uint64_t w[4];
            memcpy(w, s + i, sizeof(w));
            if ((w[0] | w[1] | w[2] | w[3]) & HIGH_BITS)
                break;
            i += 32;
        }
        while (len - i >= 8) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            uint64_t high = word & HIGH_BITS;
            if (high != 0) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                i += (size_t)__builtin_ctzll(high) / 8;
#endif
                break;
            }
            i += 8;
        }
        while (i < len && s[i] < 0x80)
            i++;
        if (i >= len)
            break;
        unsigned char c = s[i];
        size_t avail = len - i;
        if (c < 0xC2) {
            return i; /* a continuation byte, or the lead of an overlong two-byte form */
        } else if (c < 0xE0) {
            if (avail < 2 || (s[i + 1] & 0xC0) != 0x80)
                return i;
            i += 2;
        } else if (c < 0xF0) {
            unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
            if (avail < 3 || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80)
                return i;
            i += 3;
        } else if (c < 0xF5) {
            unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
            if (avail < 4 || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return i;
            i += 4;
        } else {
            return i;
        }
    }
    return len;
}

#ifdef CES_UTF8_VECTOR
/*
 * The vector check: John Keiser and Daniel Lemire, "Validating UTF-8 In Less Than One Instruction
 * Per Byte" (Software: Practice and Experience, 2021), as simdjson and simdutf implement it. Each
 * byte is classified with three 16-entry tables, by the high nibble of the byte before it, the
 * low nibble of that byte, and its own high nibble; a bit survives the AND of the three only where
 * the pair of bytes is an error of that bit's kind. Whether a byte must be a continuation of a
 * sequence begun two or three bytes before is found by comparison and must agree. It only tells
 * whether a block holds an error; where is left to the scalar check, which error paths can afford.
 */
#define TOO_SHORT (1 << 0)  /* a lead byte followed by a lead or ASCII byte */
#define TOO_LONG (1 << 1)   /* an ASCII byte followed by a continuation */
#define OVERLONG_3 (1 << 2) /* E0 80-9F */
#define TOO_LARGE (1 << 3)  /* F4 90-BF, F5-FF */
#define SURROGATE (1 << 4)  /* ED A0-BF */
#define OVERLONG_2 (1 << 5) /* C0-C1 */
#define TOO_LARGE_1000 (1 << 6) /* F5-FF 80-8F */
#define OVERLONG_4 (1 << 6) /* F0 80-8F */
/* Bit 7 (1 << 7), written as the signed char _mm_setr_epi8 takes: two continuations, not after a
 * lead of 3 or 4 bytes. */
#define TWO_CONTS (-128)
#define CARRY (TOO_SHORT | TOO_LONG | TWO_CONTS)

__attribute__((target("ssse3"))) static inline __m128i prev_bytes(__m128i input, __m128i prev,
                                                                  int n) {
    switch (n) {
    case 1: return _mm_alignr_epi8(input, prev, 15);
    case 2: return _mm_alignr_epi8(input, prev, 14);
    default: return _mm_alignr_epi8(input, prev, 13);
    }
}

__attribute__((target("ssse3"))) static inline __m128i block_errors(__m128i input, __m128i prev) {
    const __m128i byte_1_high_table =
        _mm_setr_epi8(TOO_LONG, TOO_LONG, TOO_LONG, TOO_LONG, TOO_LONG, TOO_LONG, TOO_LONG,
                      TOO_LONG, TWO_CONTS, TWO_CONTS, TWO_CONTS, TWO_CONTS,
                      TOO_SHORT | OVERLONG_2, TOO_SHORT, TOO_SHORT | OVERLONG_3 | SURROGATE,
                      TOO_SHORT | TOO_LARGE | TOO_LARGE_1000 | OVERLONG_4);
    const __m128i byte_1_low_table = _mm_setr_epi8(
        CARRY | OVERLONG_3 | OVERLONG_2 | OVERLONG_4, CARRY | OVERLONG_2, CARRY, CARRY,
        CARRY | TOO_LARGE, CARRY | TOO_LARGE | TOO_LARGE_1000, CARRY | TOO_LARGE | TOO_LARGE_1000,
        CARRY | TOO_LARGE | TOO_LARGE_1000, CARRY | TOO_LARGE | TOO_LARGE_1000,
        CARRY | TOO_LARGE | TOO_LARGE_1000, CARRY | TOO_LARGE | TOO_LARGE_1000,
        CARRY | TOO_LARGE | TOO_LARGE_1000, CARRY | TOO_LARGE | TOO_LARGE_1000,
        CARRY | TOO_LARGE | TOO_LARGE_1000 | SURROGATE, CARRY | TOO_LARGE | TOO_LARGE_1000,
        CARRY | TOO_LARGE | TOO_LARGE_1000);
    const __m128i byte_2_high_table = _mm_setr_epi8(
        TOO_SHORT, TOO_SHORT, TOO_SHORT, TOO_SHORT, TOO_SHORT, TOO_SHORT, TOO_SHORT, TOO_SHORT,
        TOO_LONG | OVERLONG_2 | TWO_CONTS | OVERLONG_3 | TOO_LARGE_1000 | OVERLONG_4,
        TOO_LONG | OVERLONG_2 | TWO_CONTS | OVERLONG_3 | TOO_LARGE,
        TOO_LONG | OVERLONG_2 | TWO_CONTS | SURROGATE | TOO_LARGE,
        TOO_LONG | OVERLONG_2 | TWO_CONTS | SURROGATE | TOO_LARGE, TOO_SHORT, TOO_SHORT,
        TOO_SHORT, TOO_SHORT);
    const __m128i low_nibble = _mm_set1_epi8(0x0F);
    __m128i prev1 = prev_bytes(input, prev, 1);
    /* There is no byte shift: shift 16-bit lanes and keep the low nibble. */
    __m128i byte_1_high = _mm_shuffle_epi8(
        byte_1_high_table, _mm_and_si128(_mm_srli_epi16(prev1, 4), low_nibble));
    __m128i byte_1_low = _mm_shuffle_epi8(byte_1_low_table, _mm_and_si128(prev1, low_nibble));
    __m128i byte_2_high = _mm_shuffle_epi8(
        byte_2_high_table, _mm_and_si128(_mm_srli_epi16(input, 4), low_nibble));
    __m128i special = _mm_and_si128(_mm_and_si128(byte_1_high, byte_1_low), byte_2_high);
    /* A byte two after a lead of three or four bytes, or three after a lead of four, must be a
     * continuation: its 0x80 bit in special says it is one (TWO_CONTS), and the two must agree. */
    __m128i third = _mm_subs_epu8(prev_bytes(input, prev, 2), _mm_set1_epi8((char)(0xE0 - 0x80)));
    __m128i fourth = _mm_subs_epu8(prev_bytes(input, prev, 3), _mm_set1_epi8((char)(0xF0 - 0x80)));
    __m128i must_continue = _mm_and_si128(_mm_or_si128(third, fourth), _mm_set1_epi8((char)0x80));
    return _mm_xor_si128(must_continue, special);
}

__attribute__((target("ssse3"))) static inline bool any_byte_set(__m128i v) {
    return _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())) != 0xFFFF;
}

/* True when text[0..len) holds no error. Pairs of blocks that are ASCII after a complete sequence
 * are skipped with one test (most CES text is ASCII). The last partial block is read through a
 * copy padded with zeros, which also catches a sequence cut short by the end (a zero is not a
 * continuation). */
__attribute__((target("ssse3"))) static bool vector_valid(const unsigned char *s, size_t len) {
    /* Lead bytes in the last three places of a block: the next block must continue them. */
    const __m128i incomplete_max = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                 -1, (char)(0xF0 - 1), (char)(0xE0 - 1),
                                                 (char)(0xC0 - 1));
    __m128i prev = _mm_setzero_si128(), error = _mm_setzero_si128();
    __m128i prev_incomplete = _mm_setzero_si128();
    size_t i = 0;
    for (; len - i >= 32; i += 32) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        if (_mm_movemask_epi8(_mm_or_si128(a, b)) == 0) {
            error = _mm_or_si128(error, prev_incomplete);
            prev_incomplete = _mm_setzero_si128();
        } else {
            error = _mm_or_si128(error, block_errors(a, prev));
            error = _mm_or_si128(error, block_errors(b, a));
            /* Unsigned input > max: subs_epu8 leaves a non-zero byte exactly there. */
            prev_incomplete = _mm_subs_epu8(b, incomplete_max);
        }
        prev = b;
        /* Stop early on hostile text; the scalar check finds where. */
        if ((i & 1023) == 992 && any_byte_set(error))
            return false;
    }
    for (;; i += 16) {
        __m128i input;
        bool last = len - i < 16;
        if (last) {
            unsigned char tail[16] = {0};
            memcpy(tail, s + i, len - i);
            input = _mm_loadu_si128((const __m128i *)tail);
        } else {
            input = _mm_loadu_si128((const __m128i *)(s + i));
        }
        /* Checked whole, ASCII or not: this also checks that prev's sequences end. */
        error = _mm_or_si128(error, block_errors(input, prev));
        prev = input;
        if (last)
            break;
    }
    return !any_byte_set(error);
}
#endif

int ces_utf8_check_vector(const char *text, size_t len) {
#ifdef CES_UTF8_VECTOR
    if (__builtin_cpu_supports("ssse3"))
        return vector_valid((const unsigned char *)text, len) ? 1 : 0;
#endif
    (void)text;
    (void)len;
    return -1;
}

size_t ces_utf8_check(const char *text, size_t len) {
    if (ces_utf8_check_vector(text, len) == 1)
        return len;
    return ces_utf8_check_scalar(text, len);
}

bool ces_utf8_valid(const char *text, size_t len) { return ces_utf8_check(text, len) == len; }
