/* verify.c - the answers of plugins that the runtime relies on, checked once where they cross
 * into it.
 *
 * bp-plugin.h states what a plugin must answer (a name that is text, an alignment that is a
 * power of two, a base that is not NULL and is aligned, an allocation size that holds the
 * tensor); the runtime computes with these answers, so one wrong answer would otherwise be a
 * crash, a heap overflow or undefined behaviour far from the plugin that gave it. Each object
 * is checked the first time the runtime needs it (a registry, device or buffer type: its
 * name, description, alignment and largest size; a buffer: its base, right after the plugin
 * made it); what passed is kept (names as copies), so a later answer cannot differ from the
 * checked one. A check that fails refuses that object only, with one sentence that names the
 * plugin and the answer: the plugin's other devices and every other plugin go on working.
 * Allocation sizes depend on the tensor and are checked on every answer; one that is too small
 * refuses the buffer type from then on.
 *
 * The plugin is asked without a lock held (its answers may come back into the runtime, even to
 * check another object, as the meta device's alignment asks its parts'); the verdict is kept
 * under one lock, the first verdict winning. Readers see the state through an atomic load and
 * read the kept answers only after it says the check is done. */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "backend-impl.h"

static pthread_mutex_t verify_lock = PTHREAD_MUTEX_INITIALIZER;

static int state_of(const struct bp__checked *c)
{
    return atomic_load_explicit(&((struct bp__checked *)c)->state, memory_order_acquire);
}

static void set_state(struct bp__checked *c, int state)
{
    atomic_store_explicit(&c->state, state, memory_order_release);
}

void bp__checked_free(struct bp__checked *c)
{
    bp__free(c->name);
    bp__free(c->refusal);
    c->name = c->refusal = NULL;
}

/* ---- Text ------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left) that is printable: not a control
 * character (C0, DEL or C1), not overlong, not a surrogate, at most U+10FFFF. 0 when the
 * sequence is not. */
static size_t printable_utf8(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    if (c < 0x20 || c == 0x7f)
        return 0;
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, cp = c & 0x1fu;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, cp = c & 0x0fu;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, cp = c & 0x07u;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[k] & 0x3fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
        return 0;
    return len;
}

/* s (n bytes) for a message: printable ASCII as is, every other byte as \xNN, cut with "..."
 * where it does not fit. */
static void show_bytes(char *out, size_t size, const char *s, size_t n)
{
    size_t o = 0, i = 0;
    for (; i < n && o + 8 < size; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
    }
    if (i < n)
        o += (size_t)snprintf(out + o, size - o, "...");
    out[o] = '\0';
}

/* Why the text s, the answer of member about the object's `what` ("name"), cannot be used, as a
 * phrase for "<object> <phrase>" (heap); NULL when it is fine. *oom tells memory running out
 * apart. */
static char *text_problem(const char *s, const char *what, const char *member, size_t max,
                          bool may_be_empty, bool *oom)
{
    char *why = NULL;
    *oom = false;
    if (s == NULL) {
        why = bp__asprintf("a plugin check", "has no %s (%s returned NULL)", what, member);
        goto out;
    }
    const size_t n = strnlen(s, max + 1);
    if (n == 0 && !may_be_empty) {
        why = bp__asprintf("a plugin check", "has an empty %s (%s returned \"\")", what, member);
        goto out;
    }
    char shown[64];
    if (n > max) {
        show_bytes(shown, sizeof(shown), s, n);
        why = bp__asprintf("a plugin check", "has a %s longer than %zu bytes (%s returned \"%s\")",
                           what, max, member, shown);
        goto out;
    }
    for (size_t i = 0; i < n;) {
        const size_t len = printable_utf8((const unsigned char *)s + i, n - i);
        if (len == 0) {
            const unsigned char c = (unsigned char)s[i];
            show_bytes(shown, sizeof(shown), s, n);
            why = bp__asprintf("a plugin check", "has a %s with %s 0x%02x at byte %zu (%s "
                               "returned \"%s\")", what,
                               c < 0x20 || c == 0x7f ? "the control byte" : "the non-UTF-8 or "
                               "non-printable byte", c, i, member, shown);
            goto out;
        }
        i += len;
    }
    return NULL;
out:
    *oom = why == NULL;
    return why;
}

/* ---- Owners and refusals ------------------------------------------------------------------ */

/* "plugin 'cuda'" for a registry a plugin made, "registry 'X'" for one made in this process. */
static char *owner_of(bp_registry *reg)
{
    if (reg == NULL) /* a buffer type the program made for no device */
        return bp__strdup("in this process", "a plugin check");
    if (reg->plugin != NULL)
        return bp__asprintf("a plugin check", "plugin '%s'", bp__plugin_name(reg->plugin));
    const char *name = state_of(&reg->checked) == BP__USABLE ? reg->checked.name : NULL;
    return name != NULL ? bp__asprintf("a plugin check", "registry '%s'", name)
                        : bp__strdup("an in-process registry", "a plugin check");
}

/* "<owner>: <what> <phrase>; the <noun> is not used" (heap; NULL when memory ran out). */
static char *refusal(bp_registry *reg, const char *what, const char *phrase, const char *noun)
{
    char *owner = owner_of(reg);
    char *s = owner != NULL ? bp__asprintf("a plugin check", "%s: %s %s; the %s is not used",
                                           owner, what, phrase, noun)
                            : NULL;
    bp__free(owner);
    return s;
}

/* The verdict of a check, made without the lock (plugin code runs during checks and may come
 * back into the runtime, even to check another object), kept under it: the first verdict
 * wins, a later one is freed. why NULL: usable, with the kept answers; else refused (the
 * answers that passed are kept too, for messages). Takes the strings either way. */
static void publish(struct bp__checked *c, char *name, char *why, char **extra, char *extra_val)
{
    pthread_mutex_lock(&verify_lock);
    if (state_of(c) == BP__UNCHECKED) {
        c->name = name;
        c->refusal = why;
        if (extra != NULL)
            *extra = extra_val;
        name = why = extra_val = NULL;
        if (c->refusal != NULL)
            bp_log(BP_LOG_WARN, "%s", c->refusal);
        set_state(c, c->refusal != NULL ? BP__REFUSED : BP__USABLE);
    }
    pthread_mutex_unlock(&verify_lock);
    bp__free(name);
    bp__free(why);
    bp__free(extra_val);
}

enum bp_status bp__refused_error(const struct bp__checked *c)
{
    return bp__error(BP_ERR_BACKEND, "%s", c->refusal ? c->refusal : "refused by its checks");
}

/* Checks the text answer of member; keeps a copy in *keep. Returns the refusal phrase (heap)
 * or NULL; false in *ok when memory ran out. */
static char *check_text(const char *s, const char *what, const char *member, size_t max,
                        bool may_be_empty, char **keep, bool *ok)
{
    bool oom;
    char *why = text_problem(s, what, member, max, may_be_empty, &oom);
    *ok = !oom;
    if (why == NULL && !oom) {
        *keep = bp__strdup(s, "a checked name");
        *ok = *keep != NULL;
    }
    return why;
}

/* ---- Registries ------------------------------------------------------------------------- */

bool bp__registry_usable(bp_registry *reg)
{
    if (state_of(&reg->checked) == BP__UNCHECKED) {
        bool ok;
        char *name = NULL, *why = NULL;
        char *phrase = check_text(reg->iface->get_name(reg), "name", "get_name", BP__NAME_MAX,
                                  false, &name, &ok);
        if (phrase != NULL)
            why = refusal(reg, "its registry", phrase, "registry");
        bp__free(phrase);
        if (ok && (phrase == NULL || why != NULL))
            publish(&reg->checked, name, why, NULL, NULL);
        else
            bp__free(name); /* out of memory: unchecked, tried again on the next use */
    }
    return state_of(&reg->checked) == BP__USABLE;
}

/* ---- Devices ---------------------------------------------------------------------------- */

bool bp__device_usable(bp_device *dev)
{
    if (state_of(&dev->checked) != BP__UNCHECKED)
        return state_of(&dev->checked) == BP__USABLE;
    bool ok;
    char *name = NULL, *desc = NULL, *what = NULL, *why = NULL;
    char *phrase = check_text(dev->iface->get_name(dev), "name", "get_name", BP__NAME_MAX, false,
                              &name, &ok);
    if (phrase == NULL && ok)
        phrase = check_text(dev->iface->get_description(dev), "description", "get_description",
                            BP__DESCRIPTION_MAX, true, &desc, &ok);
    if (phrase != NULL) {
        what = name != NULL ? bp__asprintf("a plugin check", "device %zu ('%s')", dev->index, name)
                            : bp__asprintf("a plugin check", "device %zu", dev->index);
        why = what != NULL ? refusal(dev->reg, what, phrase, "device") : NULL;
    }
    if (ok && (phrase == NULL || why != NULL)) {
        publish(&dev->checked, name, why, &dev->description, desc);
    } else {
        bp__free(name);
        bp__free(desc);
    }
    bp__free(what);
    bp__free(phrase);
    return state_of(&dev->checked) == BP__USABLE;
}

/* How many devices the plugin says reg has, bounded by how many were made for it: only those
 * can be handed out, so a larger count is not believed (nor looped over). */
static size_t device_count(bp_registry *reg, size_t *claimed)
{
    size_t n = reg->iface->get_device_count(reg);
    if (claimed != NULL)
        *claimed = n;
    return n < reg->n_devices ? n : reg->n_devices;
}

size_t bp__registry_devices(bp_registry *reg, size_t index, bp_device **out)
{
    const size_t n = device_count(reg, NULL);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bp_device *d = reg->iface->get_device(reg, i);
        if (d == NULL || d->reg != reg || !bp__device_usable(d))
            continue;
        if (k == index && out != NULL)
            *out = d;
        k++;
    }
    return k;
}

void bp__registry_refusals(bp_registry *reg, void (*fn)(void *arg, const char *sentence),
                           void *arg)
{
    size_t claimed;
    const size_t n = device_count(reg, &claimed);
    char *owner = owner_of(reg), *s = NULL;
    if (claimed > n && owner != NULL) {
        s = bp__asprintf("a plugin check", "%s: get_device_count returned %zu, but only %zu "
                         "device%s were made for its registry; the others are not used", owner,
                         claimed, n, BP_PLURAL(n));
        if (s != NULL)
            fn(arg, s);
        bp__free(s);
    }
    for (size_t i = 0; i < n && owner != NULL; i++) {
        bp_device *d = reg->iface->get_device(reg, i);
        s = NULL;
        if (d == NULL || d->reg != reg)
            s = bp__asprintf("a plugin check", "%s: get_device(%zu) returned %s; the device is "
                             "not used", owner, i, d == NULL ? "NULL" : "a device of another "
                             "registry");
        else if (!bp__device_usable(d) && d->checked.refusal != NULL)
            fn(arg, d->checked.refusal);
        if (s != NULL)
            fn(arg, s);
        bp__free(s);
    }
    bp__free(owner);
}

/* ---- Buffer types ----------------------------------------------------------------------- */

static bp_registry *registry_of(const bp_buffer_type *buft)
{
    return buft->device != NULL ? buft->device->reg : NULL;
}

/* "buffer type 'X' of device 0 ('LIAR0')" (heap), or with "a buffer type" before its name is
 * known. */
static char *buft_phrase(const bp_buffer_type *buft, const char *name)
{
    char *dev = NULL;
    if (buft->device != NULL) {
        const bp_device *d = buft->device;
        dev = state_of(&d->checked) == BP__USABLE
                  ? bp__asprintf("a plugin check", " of device %zu ('%s')", d->index,
                                 d->checked.name)
                  : bp__asprintf("a plugin check", " of device %zu", d->index);
        if (dev == NULL)
            return NULL;
    }
    char *s = name != NULL ? bp__asprintf("a plugin check", "buffer type '%s'%s", name,
                                          dev ? dev : "")
                           : bp__asprintf("a plugin check", "a buffer type%s", dev ? dev : "");
    bp__free(dev);
    return s;
}

/* The problem with the alignment a, as a phrase (static), or NULL. */
static const char *alignment_problem(size_t a)
{
    if (a == 0)
        return "0";
    if ((a & (a - 1)) != 0)
        return "not a power of two";
    if (a > BP__MAX_ALIGNMENT)
        return "more than 1 MiB";
    return NULL;
}

/* The refusal phrase for buft's alignment (*align) or largest size (heap), or NULL when both
 * pass. *oom when memory ran out. */
static char *size_problem(bp_buffer_type *buft, size_t *align, bool *oom)
{
    const size_t a = buft->iface->get_alignment(buft);
    const char *bad = alignment_problem(a);
    char *phrase = NULL;
    *align = a;
    *oom = false;
    if (bad != NULL)
        phrase = bp__asprintf("a plugin check", "has alignment %zu (get_alignment), %s; an "
                              "alignment is a power of two from 1 to %zu", a, bad,
                              BP__MAX_ALIGNMENT);
    else if (BP_HAS(struct bp_buffer_type_iface, buft->iface, get_max_size) &&
             buft->iface->get_max_size(buft) == 0)
        phrase = bp__strdup("says its largest buffer is 0 bytes (get_max_size returned 0)",
                            "a plugin check");
    else
        return NULL;
    *oom = phrase == NULL;
    return phrase;
}

/* Checks name, then alignment, then the largest size. Out of memory leaves it unchecked, to
 * be tried again. */
bool bp__buft_usable(bp_buffer_type *buft)
{
    if (state_of(&buft->checked) != BP__UNCHECKED)
        return state_of(&buft->checked) == BP__USABLE;
    bool ok, oom = false;
    size_t align = 0;
    char *name = NULL, *why = NULL, *what = NULL;
    char *phrase = check_text(buft->iface->get_name(buft), "name", "get_name", BP__NAME_MAX, false,
                              &name, &ok);
    if (phrase == NULL && ok)
        phrase = size_problem(buft, &align, &oom);
    if (phrase != NULL) {
        what = buft_phrase(buft, name);
        why = what != NULL ? refusal(registry_of(buft), what, phrase, "buffer type") : NULL;
    }
    if (ok && !oom && (phrase == NULL || why != NULL)) {
        /* The alignment is written before the state, under the lock, like the strings. */
        pthread_mutex_lock(&verify_lock);
        if (state_of(&buft->checked) == BP__UNCHECKED && alignment_problem(align) == NULL)
            buft->alignment = align;
        pthread_mutex_unlock(&verify_lock);
        publish(&buft->checked, name, why, NULL, NULL);
    } else {
        bp__free(name);
    }
    bp__free(what);
    bp__free(phrase);
    return state_of(&buft->checked) == BP__USABLE;
}

enum bp_status bp__buft_refuse(bp_buffer_type *buft, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *phrase = bp__vasprintf("a plugin check", fmt, ap);
    va_end(ap);
    bp__buft_usable(buft); /* its name, for the sentence */
    const char *name = state_of(&buft->checked) != BP__UNCHECKED ? buft->checked.name : NULL;
    char *what = phrase != NULL ? buft_phrase(buft, name) : NULL;
    char *why = what != NULL ? refusal(registry_of(buft), what, phrase, "buffer type") : NULL;
    pthread_mutex_lock(&verify_lock);
    if (why != NULL && state_of(&buft->checked) != BP__REFUSED) {
        bp_log(BP_LOG_WARN, "%s", why);
        bp__free(buft->checked.refusal);
        buft->checked.refusal = why;
        why = NULL;
        set_state(&buft->checked, BP__REFUSED);
    }
    pthread_mutex_unlock(&verify_lock);
    bp__free(phrase);
    bp__free(what);
    bp__free(why);
    if (state_of(&buft->checked) == BP__REFUSED)
        return bp__refused_error(&buft->checked);
    return bp__error(BP_ERR_OUT_OF_MEMORY, "out of memory while refusing a buffer type");
}

/* ---- Buffers ---------------------------------------------------------------------------- */

enum bp_status bp__buffer_check_base(bp_buffer *buf)
{
    bp_buffer_type *buft = buf->buft;
    void *base = buf->iface->get_base(buf);
    const uintptr_t b = (uintptr_t)base;
    const size_t align = buft->alignment > 0 ? buft->alignment : 1;
    char *bad = NULL;
    if (base == NULL && buf->size > 0)
        bad = bp__strdup("whose base is NULL (get_base returned NULL)", "a plugin check");
    else if (b % align != 0)
        bad = bp__asprintf("a plugin check", "whose base %p (get_base) is not a multiple of the "
                           "type's alignment %zu", base, align);
    else if (buf->size > UINTPTR_MAX - b)
        bad = bp__asprintf("a plugin check", "whose base %p (get_base) is so high that the "
                           "buffer wraps around the address space", base);
    else {
        buf->base = base;
        buf->base_checked = true;
        return BP_OK;
    }
    char *owner = owner_of(registry_of(buft));
    char *what = buft_phrase(buft, buft->checked.name);
    enum bp_status st =
        owner && what && bad ? bp__error(BP_ERR_BACKEND, "%s: %s made a buffer of %zu byte%s %s; "
                                         "the buffer is not used", owner, what, buf->size,
                                         BP_PLURAL(buf->size), bad)
                             : BP_ERR_OUT_OF_MEMORY;
    bp__free(owner);
    bp__free(what);
    bp__free(bad);
    return st;
}
