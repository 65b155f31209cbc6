/* The size of libwsync.so's wsyncPlugin_v1 symbol is the whole v1 table of wsync.h (with
 * AddressSanitizer's redzone in an ASan build), so a host can
 * tell which appended entries a loaded library has (WSYNC_PLUGIN_V1_HAS): every entry of this
 * build's table is inside it, and a table that ends before an entry (a library from before it
 * was appended) is told apart. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "host_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define WSYNC_TEST_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WSYNC_TEST_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef WSYNC_TEST_ADDRESS_SANITIZER
#define WSYNC_TEST_ADDRESS_SANITIZER 0
#endif

int main(void) {
  test_who = "table_size_test";
  const wsync_plugin_v1_t* api = LoadPlugin(WSYNC_PLUGIN_PATH);
  if (api == NULL) return 1;
  Dl_info info;
  const ElfW(Sym)* symbol = NULL;
  const int found = dladdr1(api, &info, (void**)&symbol, RTLD_DL_SYMENT);
  Check(found != 0 && symbol != NULL, "dladdr1 finds the table's symbol", __LINE__);
  if (found == 0 || symbol == NULL) return 1;
  Check(info.dli_sname != NULL && strcmp(info.dli_sname, "wsyncPlugin_v1") == 0,
        "the symbol at the table is wsyncPlugin_v1", __LINE__);
  const size_t size = (size_t)symbol->st_size;
#if WSYNC_TEST_ADDRESS_SANITIZER
  /* AddressSanitizer pads instrumented globals with a redzone that the symbol's size includes. */
  Check(size >= sizeof(wsync_plugin_v1_t), "the symbol holds the whole v1 table", __LINE__);
#else
  Check(size == sizeof(wsync_plugin_v1_t), "the symbol's size is the whole v1 table", __LINE__);
#endif
  Check(WSYNC_PLUGIN_V1_HAS(size, init), "has init", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, progress), "has progress", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, rebind_buffer), "has rebind_buffer", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, declare_fp8_parameter), "has declare_fp8_parameter", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, set_wave_callback), "has set_wave_callback", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, set_log), "has set_log", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, setting_count), "has setting_count", __LINE__);
  Check(WSYNC_PLUGIN_V1_HAS(size, config_set), "has config_set", __LINE__);
  /* A table that ends at finalize (a library from before progress was appended). */
  const size_t before_progress = offsetof(wsync_plugin_v1_t, progress);
  Check(WSYNC_PLUGIN_V1_HAS(before_progress, finalize), "an old table has finalize", __LINE__);
  Check(!WSYNC_PLUGIN_V1_HAS(before_progress, progress), "an old table lacks progress", __LINE__);
  Check(!WSYNC_PLUGIN_V1_HAS(offsetof(wsync_plugin_v1_t, declare_fp8_parameter),
                             declare_fp8_parameter),
        "a table ending at rebind_buffer lacks declare_fp8_parameter", __LINE__);
  Check(!WSYNC_PLUGIN_V1_HAS(offsetof(wsync_plugin_v1_t, set_parameter_wave), set_wave_callback),
        "a table ending at declare_fp8_parameter lacks set_wave_callback", __LINE__);
  Check(!WSYNC_PLUGIN_V1_HAS(offsetof(wsync_plugin_v1_t, set_log), set_log),
        "a table ending at set_wave_callback lacks set_log", __LINE__);
  Check(!WSYNC_PLUGIN_V1_HAS(offsetof(wsync_plugin_v1_t, setting_count), setting_count),
        "a table ending at set_log lacks setting_count", __LINE__);
  Check(!WSYNC_PLUGIN_V1_HAS(offsetof(wsync_plugin_v1_t, setting_count), config_set),
        "a table ending at set_log lacks config_set", __LINE__);
  printf("table_size_test: %d passed, %d failed\n", test_passed, test_failed);
  return test_failed == 0 ? 0 : 1;
}
