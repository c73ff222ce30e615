// Replays files through a libFuzzer target without libFuzzer, so that every
// build (gcc, no -fsanitize=fuzzer) runs the committed corpus as a regression
// test: replay_<target> DIR_OR_FILE...
// Exits non-zero if an argument cannot be read or no input was found; a bug
// in the target aborts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace fs = std::filesystem;

namespace {

bool run_file(const fs::path &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        fprintf(stderr, "replay: cannot read %s\n", path.c_str());
        return false;
    }
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // an exact-size heap copy, as libFuzzer passes it (overreads hit ASan)
    std::vector<uint8_t> data(bytes.begin(), bytes.end());
    fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), data.size());
    LLVMFuzzerTestOneInput(data.empty() ? nullptr : data.data(), data.size());
    return true;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        std::error_code ec;
        fs::path arg(argv[i]);
        if (fs::is_directory(arg, ec)) {
            std::vector<fs::path> files;
            for (const auto &e : fs::recursive_directory_iterator(arg, ec))
                if (e.is_regular_file()) files.push_back(e.path());
            if (ec) {
                fprintf(stderr, "replay: cannot list %s: %s\n", argv[i], ec.message().c_str());
                return 1;
            }
            std::sort(files.begin(), files.end());
            for (const auto &f : files) {
                if (!run_file(f)) return 1;
                n++;
            }
        } else {
            if (!run_file(arg)) return 1;
            n++;
        }
    }
    if (n == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    fprintf(stderr, "replay: %zu inputs, no failure\n", n);
    return 0;
}
