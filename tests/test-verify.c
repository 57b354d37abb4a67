/* test-verify.c - the runtime's checks of what plugins answer (runtime/verify.c), through the
 * liar plugin of tests/plugins-liar/ (plugin.c with MODE_LIE): its first device breaks the
 * plugin API in the way BP_TEST_LIE names, its second stays honest. Each test (its own process)
 * loads it beside the CPU plugin and checks that the lie is refused with a sentence naming the
 * plugin and the answer, that nothing crashes or overflows (run it under the sanitizer build
 * too), and that the honest device and the CPU plugin still compute. */
#include <backplane/bp-plugin.h>

#include "test-util.h"

/* Loads the liar (telling lie) and the CPU plugin. */
static void load_with_lie(const char *lie)
{
    const char *liar = getenv("BP_TEST_LIAR_PLUGIN_DIR"), *cpu = getenv("BP_TEST_CPU_PLUGIN_DIR");
    ck_assert_msg(liar != NULL && cpu != NULL, "run through make check");
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", liar, cpu);
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    setenv("BP_TEST_LIE", lie, 1);
    ck_assert_int_eq(bp_plugin_load_all(), BP_OK);
    ck_assert_plugins(bp_plugin_by_name("cpu") != NULL, "the CPU plugin did not load");
}

/* The message of the liar's record with that status, NULL when there is none (a second one
 * fails the test). */
static const char *liar_record(enum bp_plugin_status status)
{
    const char *found = NULL;
    for (size_t i = 0; i < bp_plugin_report_count(); i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        if (strcmp(r->name, "liar") == 0 && r->status == status) {
            ck_assert_msg(found == NULL, "two '%s' records of the liar: '%s' and '%s'",
                          bp_plugin_status_name(status), found, r->message);
            found = r->message;
        }
    }
    return found;
}

#define ck_assert_has(text, needle)                                                            \
    do {                                                                                       \
        const char *t_ = (text);                                                               \
        ck_assert_msg(t_ != NULL, "no text where '%s' was expected", (needle));                \
        ck_assert_msg(strstr(t_, (needle)) != NULL, "'%s' lacks '%s'", t_, (needle));          \
    } while (0)

/* a + b on backend be, checked against the sums computed here: the device still computes. */
static void check_add(bp_backend *be)
{
    ck_assert_ptr_nonnull(be);
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_tensor *sum = bp_add(ctx, a, b);
    bp_graph *g = bp_graph_new(8);
    bp_graph_build_forward(g, sum);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    ck_assert_msg(buf != NULL, "%s", bp_last_error());
    float x[16], y[16], z[16];
    for (int i = 0; i < 16; i++) {
        x[i] = (float)i;
        y[i] = 0.5f * (float)(i * i);
    }
    ck_assert_int_eq(bp_tensor_set(a, x, 0, sizeof(x)), BP_OK);
    ck_assert_int_eq(bp_tensor_set(b, y, 0, sizeof(y)), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
    ck_assert_int_eq(bp_tensor_get(sum, z, 0, sizeof(z)), BP_OK);
    for (int i = 0; i < 16; i++)
        ck_assert_float_eq(z[i], (float)i + 0.5f * (float)(i * i));
    bp_buffer_free(buf);
    bp_graph_free(g);
    bp_context_free(ctx);
    bp_backend_free(be);
}

/* The CPU plugin and the liar's honest second device both still work in this process. */
static void others_still_work(void)
{
    check_add(bp_backend_init_by_name("CPU", NULL));
    check_add(bp_backend_init_by_name("LIAR1", NULL));
}

/* A device whose name or description is not text: left out of the registry's devices, the
 * refusal in the load report, the other device and the CPU plugin unaffected. */
static void check_device_refused(const char *lie, const char *answer)
{
    load_with_lie(lie);
    ck_assert_has(liar_record(BP_PLUGIN_LOADED), "registry 'Liar' with 1 device");
    const char *why = liar_record(BP_PLUGIN_REFUSED);
    ck_assert_has(why, "plugin 'liar': device 0");
    ck_assert_has(why, answer);
    ck_assert_has(why, "the device is not used");
    bp_registry *reg = bp_registry_by_name("Liar");
    ck_assert_ptr_nonnull(reg);
    ck_assert_uint_eq(bp_registry_get_device_count(reg), 1);
    ck_assert_str_eq(bp_device_get_name(bp_registry_get_device(reg, 0)), "LIAR1");
    /* Every list of names (the error of an unknown name) is built without the liar's. */
    ck_assert_rejected(bp_device_by_name("nonesuch"), BP_ERR_NOT_FOUND, "LIAR1");
    ck_assert_msg(strstr(bp_last_error(), "LIAR0") == NULL, "%s", bp_last_error());
    for (size_t i = 0; i < bp_device_count(); i++) {
        const char *name = bp_device_get_name(bp_device_get(i));
        ck_assert_msg(name[0] != '\0', "device %zu has an empty name", i);
        ck_assert_ptr_nonnull(bp_device_get_description(bp_device_get(i)));
    }
    others_still_work();
}

START_TEST(test_device_name_null)
{
    check_device_refused("name-null", "has no name (get_name returned NULL)");
}
END_TEST

START_TEST(test_device_name_empty)
{
    check_device_refused("name-empty", "has an empty name (get_name returned \"\")");
}
END_TEST

START_TEST(test_device_name_control)
{
    check_device_refused("name-control", "the control byte 0x1b at byte 4 (get_name returned "
                                         "\"LIAR\\x1b[31m0\")");
}
END_TEST

START_TEST(test_device_name_not_utf8)
{
    check_device_refused("name-utf8", "non-printable byte 0xff at byte 4");
}
END_TEST

START_TEST(test_device_description_null)
{
    check_device_refused("desc-null",
                         "device 0 ('LIAR0') has no description (get_description returned NULL)");
}
END_TEST

/* What the liar's first device's buffer type does with a 1 KiB allocation and with a context
 * of two tensors: both refused with the sentence, nothing placed. */
static void check_buffer_refused(const char *lie, const char *answer, const char *object)
{
    load_with_lie(lie);
    ck_assert_ptr_null(liar_record(BP_PLUGIN_REFUSED));
    bp_device *dev = bp_device_by_name("LIAR0");
    ck_assert_ptr_nonnull(dev);
    bp_buffer_type *buft = bp_device_get_buffer_type(dev);
    ck_assert_ptr_nonnull(buft);
    bp_clear_error();
    ck_assert_ptr_null(bp_buffer_type_alloc(buft, 1024));
    ck_assert_error_has(BP_ERR_BACKEND, "plugin 'liar': ");
    ck_assert_error_has(BP_ERR_BACKEND, answer);
    ck_assert_error_has(BP_ERR_BACKEND, object);

    bp_context *ctx = bp_context_new(4);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    ck_assert_rejected(bp_alloc_ctx_tensors(ctx, buft), BP_ERR_BACKEND, answer);
    ck_assert_ptr_null(a->data);
    ck_assert_ptr_null(b->data);
    bp_context_free(ctx);
    /* The alignment answer the allocators compute with is always a usable one. */
    size_t align = bp_buffer_type_get_alignment(buft);
    ck_assert_msg(align >= 1 && (align & (align - 1)) == 0, "alignment %zu", align);
    others_still_work();
}

START_TEST(test_base_null)
{
    check_buffer_refused("base-null", "whose base is NULL (get_base returned NULL); the buffer "
                         "is not used", "buffer type 'TestAccel' of device 0 ('LIAR0') made a "
                         "buffer of 1024 bytes");
}
END_TEST

START_TEST(test_base_misaligned)
{
    check_buffer_refused("base-misaligned", "is not a multiple of the type's alignment 128",
                         "the buffer is not used");
}
END_TEST

START_TEST(test_alignment_zero)
{
    check_buffer_refused("align-0", "has alignment 0 (get_alignment)",
                         "the buffer type is not used");
}
END_TEST

START_TEST(test_alignment_three)
{
    check_buffer_refused("align-3", "has alignment 3 (get_alignment), not a power of two",
                         "the buffer type is not used");
}
END_TEST

START_TEST(test_alignment_huge)
{
    check_buffer_refused("align-huge", "has alignment 1099511627776 (get_alignment), more than "
                         "1 MiB", "the buffer type is not used");
}
END_TEST

START_TEST(test_max_size_zero)
{
    check_buffer_refused("max-size-0", "says its largest buffer is 0 bytes (get_max_size "
                         "returned 0)", "the buffer type is not used");
}
END_TEST

/* An allocation size smaller than the tensor: the first answer refuses the type, the tensors
 * are not placed (they would overlap and the plugin would write past its memory), and a
 * buffer made before the lie places nothing more. */
static void check_alloc_size_refused(const char *lie, const char *answer)
{
    load_with_lie(lie);
    bp_buffer_type *buft = bp_device_get_buffer_type(bp_device_by_name("LIAR0"));
    ck_assert_ptr_nonnull(buft);
    bp_buffer *early = bp_buffer_type_alloc(buft, 4096);
    ck_assert_msg(early != NULL, "%s", bp_last_error());
    bp_context *ctx = bp_context_new(4);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    ck_assert_rejected(bp_alloc_ctx_tensors(ctx, buft), BP_ERR_BACKEND,
                       "plugin 'liar': buffer type 'TestAccel' of device 0 ('LIAR0') says");
    ck_assert_error_has(BP_ERR_BACKEND, answer);
    ck_assert_error_has(BP_ERR_BACKEND, "less than its 64; the buffer type is not used");
    ck_assert_ptr_null(a->data);
    ck_assert_ptr_null(b->data);
    /* The answer the runtime computes with is never less than the tensor's bytes. */
    ck_assert_uint_ge(bp_buffer_type_get_alloc_size(buft, a), bp_nbytes(a));
    ck_assert_int_eq(bp_buffer_place_tensor(early, a, bp_buffer_get_base(early)), BP_ERR_BACKEND);
    ck_assert_error_has(BP_ERR_BACKEND, "the buffer type is not used");
    ck_assert_ptr_null(a->data);
    bp_buffer_free(early);
    bp_context_free(ctx);
    others_still_work();
}

START_TEST(test_alloc_size_zero)
{
    check_alloc_size_refused("alloc-size-0", "needs 0 bytes (get_alloc_size)");
}
END_TEST

START_TEST(test_alloc_size_too_small)
{
    check_alloc_size_refused("alloc-size-small", "needs 32 bytes (get_alloc_size)");
}
END_TEST

/* A registry without a name cannot be told apart from others: the plugin is not loaded. */
START_TEST(test_registry_name_null)
{
    load_with_lie("reg-name-null");
    ck_assert_ptr_null(liar_record(BP_PLUGIN_LOADED));
    ck_assert_has(liar_record(BP_PLUGIN_FAILED), "plugin 'liar': its registry has no name "
                                                 "(get_name returned NULL); the registry is not "
                                                 "used");
    ck_assert_ptr_null(bp_plugin_by_name("liar"));
    check_add(bp_backend_init_by_name("CPU", NULL));
}
END_TEST

START_TEST(test_device_null)
{
    load_with_lie("device-null");
    ck_assert_has(liar_record(BP_PLUGIN_LOADED), "registry 'Liar' with 1 device");
    ck_assert_has(liar_record(BP_PLUGIN_REFUSED), "plugin 'liar': get_device(0) returned NULL; "
                                                  "the device is not used");
    others_still_work();
}
END_TEST

START_TEST(test_device_count_too_large)
{
    load_with_lie("count-too-many");
    ck_assert_has(liar_record(BP_PLUGIN_LOADED), "registry 'Liar' with 2 devices");
    ck_assert_has(liar_record(BP_PLUGIN_REFUSED), "plugin 'liar': get_device_count returned 7, "
                                                  "but only 2 devices were made");
    ck_assert_rejected(bp_registry_get_device(bp_registry_by_name("Liar"), 2),
                       BP_ERR_OUT_OF_BOUNDS, "no device 2");
    check_add(bp_backend_init_by_name("LIAR0", NULL));
    others_still_work();
}
END_TEST

/* A failing read is reported with the plugin's status, never turned into data. */
START_TEST(test_get_tensor_fails)
{
    load_with_lie("get-tensor-fails");
    bp_backend *be = bp_backend_init_by_name("LIAR0", NULL);
    ck_assert_ptr_nonnull(be);
    bp_context *ctx = bp_context_new(2);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    ck_assert_ptr_nonnull(buf);
    float x[16] = {1};
    ck_assert_int_eq(bp_tensor_set(a, x, 0, sizeof(x)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(a, x, 0, sizeof(x)), BP_ERR_BACKEND);
    ck_assert_error_has(BP_ERR_BACKEND, "reading 64 bytes back failed (injected)");
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(be);
    others_still_work();
}
END_TEST

/* Without a lie the liar is an ordinary plugin: both devices, no refusal. */
START_TEST(test_honest_plugin_untouched)
{
    load_with_lie("none");
    ck_assert_has(liar_record(BP_PLUGIN_LOADED), "registry 'Liar' with 2 devices");
    ck_assert_ptr_null(liar_record(BP_PLUGIN_REFUSED));
    ck_assert_str_eq(bp_device_get_description(bp_device_by_name("LIAR0")),
                     "backplane test accelerator");
    check_add(bp_backend_init_by_name("LIAR0", NULL));
    others_still_work();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("verify");
    BP_TCASE(s, test_device_name_null, 60);
    BP_TCASE(s, test_device_name_empty, 60);
    BP_TCASE(s, test_device_name_control, 60);
    BP_TCASE(s, test_device_name_not_utf8, 60);
    BP_TCASE(s, test_device_description_null, 60);
    BP_TCASE(s, test_base_null, 60);
    BP_TCASE(s, test_base_misaligned, 60);
    BP_TCASE(s, test_alignment_zero, 60);
    BP_TCASE(s, test_alignment_three, 60);
    BP_TCASE(s, test_alignment_huge, 60);
    BP_TCASE(s, test_max_size_zero, 60);
    BP_TCASE(s, test_alloc_size_zero, 60);
    BP_TCASE(s, test_alloc_size_too_small, 60);
    BP_TCASE(s, test_registry_name_null, 60);
    BP_TCASE(s, test_device_null, 60);
    BP_TCASE(s, test_device_count_too_large, 60);
    BP_TCASE(s, test_get_tensor_fails, 60);
    BP_TCASE(s, test_honest_plugin_untouched, 60);
    return bp_test_run(s);
}
