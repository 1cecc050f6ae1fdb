#include "util/array.h"

#include <stdint.h>
#include <stdlib.h>

void *ces_array_grow(void *items, size_t *capacity, size_t need, size_t size, size_t first) {
    size_t cap = *capacity > 0 && items != NULL ? *capacity : (first > 0 ? first : 1);
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return NULL;
        cap *= 2;
    }
    if (size != 0 && cap > SIZE_MAX / size)
        return NULL;
    void *grown = realloc(items, cap * size);
    if (grown == NULL)
        return NULL;
    *capacity = cap;
    return grown;
}
