/* Code point classes and UTF-8 decoding. See unicode.h. */
#include "tokenizer/unicode.h"

#include <pthread.h>

/* Below this a class is one table load; the rarer planes above (CJK
 * extensions, tags) search the ranges. The table covers the Basic
 * Multilingual Plane and the Supplementary one (emoji, old scripts). */
#define TABLE_CPS 0x20000u

static uint8_t table[TABLE_CPS];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void fill_table(void)
{
    for (int i = 0; i < dt_uc_nranges && dt_uc_ranges[i].first < TABLE_CPS; i++) {
        uint32_t last = dt_uc_ranges[i].last < TABLE_CPS ? dt_uc_ranges[i].last : TABLE_CPS - 1;
        for (uint32_t cp = dt_uc_ranges[i].first; cp <= last; cp++)
            table[cp] = dt_uc_ranges[i].cls;
    }
}

static int search(uint32_t cp)
{
    int lo = 0, hi = dt_uc_nranges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < dt_uc_ranges[mid].first) hi = mid - 1;
        else if (cp > dt_uc_ranges[mid].last) lo = mid + 1;
        else return dt_uc_ranges[mid].cls;
    }
    return DT_UC_OTHER;
}

int dt_uc_class(uint32_t cp)
{
    if (cp >= TABLE_CPS) return search(cp);
    pthread_once(&table_once, fill_table);
    return table[cp];
}

int dt_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp, int *cut)
{
    unsigned c = s[0];
    *cut = 0;
    *cp = DT_UC_INVALID;
    if (c < 0x80) return *cp = c, 1;
    /* The length from the first byte, and the smallest code point that
     * length may carry (less is an overlong form). */
    int len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 ? 4 : 0;
    if (!len || c > 0xF4) return 1;
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t v = c & (0x7Fu >> len);
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return *cut = 1, 1;
        if ((s[k] & 0xC0) != 0x80) return 1;
        v = (v << 6) | (s[k] & 0x3Fu);
    }
    if (v < least[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    return len;
}
