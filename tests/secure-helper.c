/* secure-helper.c - private to tests/test-secure.sh: reports whether this process runs in
 * secure-execution mode (AT_SECURE: setuid/setgid or file capabilities) and what plugin
 * discovery found, so the script can check that BP_PLUGIN_PATH and BP_PLUGIN_SYSTEM_PATH are
 * ignored when it is. */
#include <stdio.h>
#include <sys/auxv.h>

#include <backplane/backplane.h>

int main(void)
{
    printf("at_secure=%lu\n", getauxval(AT_SECURE));
    bp_plugin_load_all();
    for (size_t i = 0; i < bp_plugin_report_count(); i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        printf("record %s %s\n", bp_plugin_status_name(r->status), r->path);
    }
    printf("devices=%zu\n", bp_device_count());
    return 0;
}
