/* missing.c - private to tests/: the library the "needslib" test plugin links against. It is
 * built only to link that plugin and is never put where the dynamic loader looks, so loading
 * the plugin fails the way a CUDA plugin does on a machine without libcudart. */
int bp_missing_answer(void);

int bp_missing_answer(void)
{
    return 42;
}
