// The plugin loader (plugin.h).
#include "registry/plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "kvx_build_id.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx {

namespace {

struct Loaded {
    const BackendDesc *desc = nullptr;
    std::string path, why;
};

// Held while a plugin loads, so that every caller gets the one result. A
// fork waits for a load in progress (pthread_atfork below): a child must
// not inherit it locked by a thread it does not have.
std::mutex g_mu;
std::map<std::string, Loaded> g_loaded;  // by backend name, under g_mu

[[maybe_unused]] const int g_atfork = pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
                                                     [] { g_mu.unlock(); });

void add_dir(std::vector<std::string> *dirs, std::string d) {
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    if (d.empty()) return;
    for (const std::string &x : *dirs)
        if (x == d) return;
    dirs->push_back(std::move(d));
}

// Opens path and checks its entry; the backend, or nullptr with *why.
const BackendDesc *open_plugin(const char *backend, const std::string &path, std::string *why) {
    dlerror();
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        const std::string err = e ? e : "unknown error";
        // A plugin of another build calls internals this library lacks.
        const bool other = err.find("KVXFER_PRIVATE") != std::string::npos ||
                           err.find("undefined symbol: _ZN3kvx") != std::string::npos;
        *why = strfmt("cannot load %s: %s%s", path.c_str(), err.c_str(),
                      other ? strfmt(" (a plugin of another kvxfer build: install the %s plugin of this one, %s)",
                                     backend, KVX_BUILD_ID).c_str()
                            : "");
        return nullptr;
    }
    auto entry = reinterpret_cast<const PluginEntry *(*)()>(dlsym(h, kPluginEntrySymbol));
    const PluginEntry *e = entry ? entry() : nullptr;
    if (!e) {
        *why = strfmt("%s is not a kvxfer plugin (no %s)", path.c_str(), kPluginEntrySymbol);
    } else if (e->abi != kPluginAbi) {
        *why = strfmt("%s has plugin ABI %u, this libkvxfer (%s) takes ABI %u: install the %s plugin of the same "
                      "kvxfer",
                      path.c_str(), e->abi, KVX_BUILD_ID, kPluginAbi, backend);
    } else if (e->size < sizeof(PluginEntry) || !e->build_id || strcmp(e->build_id, KVX_BUILD_ID) != 0) {
        *why = strfmt("%s is from another kvxfer build (%s), this libkvxfer is %s: install the %s plugin of the "
                      "same build",
                      path.c_str(), e->size >= sizeof(PluginEntry) && e->build_id ? e->build_id : "unknown",
                      KVX_BUILD_ID, backend);
    } else if (!e->desc || !e->desc->name || strcmp(e->desc->name, backend) != 0) {
        *why = strfmt("%s is not the %s plugin (it serves %s)", path.c_str(), backend,
                      e->desc && e->desc->name ? e->desc->name : "nothing");
    } else {
        return e->desc;  // kept loaded for the life of the process
    }
    dlclose(h);
    return nullptr;
}

Loaded load(const char *backend) {
    Loaded l;
    const std::string file = plugin_file(backend);
    std::string searched;
    for (const std::string &dir : plugin_dirs()) {
        const std::string path = dir + "/" + file;
        if (access(path.c_str(), F_OK) != 0) {
            searched += strfmt("%s%s", searched.empty() ? "" : ", ", dir.c_str());
            continue;
        }
        l.path = path;
        l.desc = open_plugin(backend, path, &l.why);
        return l;
    }
    l.why = strfmt("the %s plugin %s is not installed (searched %s)", backend, file.c_str(), searched.c_str());
    return l;
}

}  // namespace

std::string plugin_file(const char *backend) { return strfmt("libkvxfer-%s.so", backend); }

std::vector<std::string> plugin_dirs() {
    std::vector<std::string> dirs;
    if (const char *env = secure_getenv("KVX_PLUGIN_PATH")) {
        const char *p = env;
        while (*p) {
            const char *colon = strchr(p, ':');
            const size_t n = colon ? static_cast<size_t>(colon - p) : strlen(p);
            add_dir(&dirs, std::string(p, n));
            p += n + (colon ? 1 : 0);
        }
    }
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&plugin_dirs), &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        char *real = realpath(info.dli_fname, nullptr);  // the directory of the file, not of a link to it
        std::string self = real ? real : info.dli_fname;
        free(real);
        add_dir(&dirs, self.substr(0, self.rfind('/')) + "/kvxfer-0");
    }
    add_dir(&dirs, KVX_PLUGIN_INSTALL_DIR);
    return dirs;
}

const BackendDesc *plugin_backend(const char *backend, std::string *why) {
    Loaded got;
    bool first = false;
    {
        std::lock_guard<std::mutex> lk(g_mu);  // held while loading: others wait for the one result
        auto it = g_loaded.find(backend);
        if (it == g_loaded.end()) {
            it = g_loaded.emplace(backend, load(backend)).first;
            first = true;
        }
        got = it->second;
    }
    if (first && got.desc) KVX_LOG(info, "%s: plugin %s loaded", backend, got.path.c_str());
    if (first && !got.desc) KVX_LOG(info, "%s: no plugin: %s", backend, got.why.c_str());  // (no lock held: see g_atfork)
    if (!got.desc && why) *why = got.why;
    return got.desc;
}

bool plugin_status(const char *backend, std::string *path, std::string *why) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_loaded.find(backend);
    if (it == g_loaded.end()) return false;
    *path = it->second.path;
    *why = it->second.why;
    return true;
}

int plugin_report(const char *backend, char *out, size_t cap) {
    std::string why, path, dirs;
    const bool loaded = plugin_backend(backend, &why) != nullptr;
    plugin_status(backend, &path, &why);
    for (const std::string &d : plugin_dirs()) dirs += (dirs.empty() ? "" : ":") + d;
    const std::string text = strfmt("%d\n%s\n%s\n%s", loaded ? 1 : 0, path.c_str(), loaded ? "" : why.c_str(),
                                    dirs.c_str());
    if (cap) snprintf(out, cap, "%s", text.c_str());
    return text.size() < cap ? 0 : -1;
}

}  // namespace kvx
