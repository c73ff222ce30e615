// The backend registry: every entry's metadata section id is its own (2 and
// up; 1 is the core section), every name is unique and a valid value of the
// backend option, and docs/wire-format.md describes each entry's section
// under its id and name.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "registry/registry.h"
#include "wire/metadata.h"

#include "unit_util.h"

using namespace kvx;

namespace {

void test_section_ids_unique(void **) {
    std::set<uint16_t> ids;
    std::set<std::string> names;
    assert_true(backend_registry().size() >= 2);  // shm and tcp are always built
    for (const BackendDesc *b : backend_registry()) {
        assert_true(b->id > wire::kSectionCore);
        assert_true(ids.insert(b->id).second);     // no two backends share a section id
        assert_true(names.insert(b->name).second);
        assert_true(is_backend_name(b->name));
        assert_ptr_equal(find_backend(b->name), b);
    }
}

void test_sections_documented(void **) {
    std::ifstream f(KVX_SOURCE_DIR "/docs/wire-format.md");
    assert_true(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string doc = ss.str();
    for (const BackendDesc *b : backend_registry()) {
        const std::string heading = "### Section " + std::to_string(b->id) + ": " + b->name;
        if (doc.find(heading) == std::string::npos) fail_msg("docs/wire-format.md lacks '%s'", heading.c_str());
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_section_ids_unique),
        cmocka_unit_test(test_sections_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
