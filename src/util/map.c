#include "util/map.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/arena.h"

typedef struct {
    char *key; /* NULL: empty slot */
    size_t len;
    uint64_t hash;
    void *value;
} slot_t;

struct ces_map_s {
    slot_t *slots;
    size_t capacity; /* a power of two */
    size_t count;
    ces_arena_t *keys; /* ces_map_new_scratch: where the key copies are */
};

static uint64_t hash_bytes(const char *key, size_t len) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ULL;
    }
    return h;
}

ces_map_t *ces_map_new(void) {
    ces_map_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->capacity = 16;
    m->slots = calloc(m->capacity, sizeof(slot_t));
    if (m->slots == NULL) {
        free(m);
        return NULL;
    }
    return m;
}

ces_map_t *ces_map_new_scratch(void) {
    ces_map_t *m = ces_map_new();
    if (m != NULL && (m->keys = ces_arena_new()) == NULL) {
        ces_map_destroy(m);
        return NULL;
    }
    return m;
}

void ces_map_clear(ces_map_t *map, void (*fn)(void *value, void *arg), void *arg) {
    for (size_t i = 0; i < map->capacity; i++) {
        if (map->slots[i].key != NULL) {
            if (fn != NULL)
                fn(map->slots[i].value, arg);
            if (map->keys == NULL)
                free(map->slots[i].key);
            map->slots[i].key = NULL;
        }
    }
    map->count = 0;
    if (map->keys != NULL)
        ces_arena_reset(map->keys);
}

void ces_map_destroy(ces_map_t *map) {
    if (map == NULL)
        return;
    ces_map_clear(map, NULL, NULL);
    ces_arena_destroy(map->keys);
    free(map->slots);
    free(map);
}

static slot_t *find_slot(slot_t *slots, size_t capacity, const char *key, size_t len, uint64_t h) {
    size_t i = (size_t)h & (capacity - 1);
    for (;;) {
        slot_t *s = &slots[i];
        if (s->key == NULL || (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0))
            return s;
        i = (i + 1) & (capacity - 1);
    }
}

void *ces_map_get(const ces_map_t *map, const char *key, size_t len) {
    slot_t *s = find_slot(map->slots, map->capacity, key, len, hash_bytes(key, len));
    return s->key ? s->value : NULL;
}

static int grow(ces_map_t *map) {
    size_t cap = map->capacity * 2;
    slot_t *slots = calloc(cap, sizeof(slot_t));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < map->capacity; i++) {
        slot_t *old = &map->slots[i];
        if (old->key != NULL)
            *find_slot(slots, cap, old->key, old->len, old->hash) = *old;
    }
    free(map->slots);
    map->slots = slots;
    map->capacity = cap;
    return 0;
}

int ces_map_put(ces_map_t *map, const char *key, size_t len, void *value) {
    if ((map->count + 1) * 4 > map->capacity * 3 && grow(map) != 0)
        return -1;
    uint64_t h = hash_bytes(key, len);
    slot_t *s = find_slot(map->slots, map->capacity, key, len, h);
    if (s->key == NULL) {
        if (map->keys != NULL) {
            s->key = ces_arena_strndup(map->keys, key, len);
        } else if ((s->key = malloc(len + 1)) != NULL) {
            memcpy(s->key, key, len);
            s->key[len] = '\0';
        }
        if (s->key == NULL)
            return -1;
        s->len = len;
        s->hash = h;
        map->count++;
    }
    s->value = value;
    return 0;
}

void *ces_map_remove(ces_map_t *map, const char *key, size_t len) {
    slot_t *s = find_slot(map->slots, map->capacity, key, len, hash_bytes(key, len));
    if (s->key == NULL)
        return NULL;
    void *value = s->value;
    if (map->keys == NULL)
        free(s->key);
    s->key = NULL;
    map->count--;
    /* Backward-shift deletion: move later entries of the probe run into the hole when their home
     * slot does not lie cyclically between the hole and themselves. */
    size_t mask = map->capacity - 1;
    size_t hole = (size_t)(s - map->slots);
    for (size_t j = (hole + 1) & mask; map->slots[j].key != NULL; j = (j + 1) & mask) {
        size_t home = (size_t)map->slots[j].hash & mask;
        bool between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!between) {
            map->slots[hole] = map->slots[j];
            map->slots[j].key = NULL;
            hole = j;
        }
    }
    return value;
}

size_t ces_map_count(const ces_map_t *map) { return map->count; }

void ces_map_each(ces_map_t *map, void (*fn)(void *value, void *arg), void *arg) {
    for (size_t i = 0; i < map->capacity; i++) {
        if (map->slots[i].key != NULL)
            fn(map->slots[i].value, arg);
    }
}

void *ces_map_next(const ces_map_t *map, ces_map_iter_t *it, const char **key, size_t *len) {
    while (it->next_slot < map->capacity) {
        const slot_t *slot = &map->slots[it->next_slot++];
        if (slot->key != NULL) {
            if (key != NULL)
                *key = slot->key;
            if (len != NULL)
                *len = slot->len;
            return slot->value;
        }
    }
    return NULL;
}

size_t ces_map_key(char *buf, size_t size, char sep, const char *const *parts, size_t n) {
    if (size == 0)
        return 0;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && used < size - 1)
            buf[used++] = sep;
        const char *part = parts[i] != NULL ? parts[i] : "";
        size_t len = strlen(part);
        if (len > size - 1 - used)
            len = size - 1 - used;
        memcpy(buf + used, part, len);
        used += len;
    }
    buf[used] = '\0';
    return used;
}
