#include "core/registrations.h"

#include <chrono>
#include <system_error>

#include "util/error.h"

namespace kvx {

Registrations::Ref Registrations::reserve_locked(const std::string &id, uint64_t reg, bool replace) {
    auto it = by_id_.find(id);
    if (it != by_id_.end()) {
        if (!replace) fail(KVX_EEXIST, "peer '%s' is being registered already", id.c_str());
        cancel_locked(id, KVX_ECANCELED, "superseded by a later add of the same id");
    }
    auto r = std::make_shared<Pending>();
    r->reg = reg;
    r->id = id;
    by_id_[id] = r;
    if (reg) outcomes_[reg] = Status{};
    return r;
}

void Registrations::finish_locked(const Ref &r, int status, const std::string &message) {
    if (r->finished) return;
    r->finished = true;
    if (r->current) {
        r->current = false;
        by_id_.erase(r->id);
    }
    if (r->reg) record_locked(r->reg, status, message);
}

bool Registrations::cancel_locked(const std::string &id, int code, const char *why) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    Ref r = it->second;
    by_id_.erase(it);
    r->current = false;
    r->cancel_code = code;
    r->called_off.store(true);  // its connect waits end within a slice
    // Reported now, so that nobody waits for the attempt still connecting;
    // the attempt itself only closes what it opened.
    // (id may have been the erased key: r owns a copy)
    if (r->reg) record_locked(r->reg, code, strfmt("peer '%s': registration %llu cancelled: %s", r->id.c_str(),
                                                   (unsigned long long)r->reg, why));
    return true;
}

void Registrations::cancel_all_locked(int code, const char *why) {
    while (!by_id_.empty()) cancel_locked(std::string(by_id_.begin()->first), code, why);
}

void Registrations::record_locked(uint64_t reg, int status, const std::string &message) {
    auto it = outcomes_.find(reg);
    if (it == outcomes_.end() || it->second.state != KVX_REGISTRATION_PENDING) return;  // reported or decided
    it->second.state = status == 0 ? KVX_REGISTRATION_DONE : KVX_REGISTRATION_FAILED;
    it->second.error = status;
    it->second.message = message;
    cv_.notify_all();
}

Registrations::Status Registrations::wait(std::unique_lock<std::mutex> &lk, uint64_t reg, int timeout_ms) {
    auto pending = [&] {
        auto it = outcomes_.find(reg);
        return it != outcomes_.end() && it->second.state == KVX_REGISTRATION_PENDING;
    };
    if (timeout_ms < 0) cv_.wait(lk, [&] { return !pending(); });
    else if (timeout_ms > 0) cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !pending(); });
    auto it = outcomes_.find(reg);
    if (it == outcomes_.end())
        fail(KVX_ENOENT, "registration %llu is unknown or its outcome was already reported", (unsigned long long)reg);
    Status s = it->second;
    if (s.state != KVX_REGISTRATION_PENDING) outcomes_.erase(it);
    return s;
}

void Registrations::start() { launcher_ = std::thread([this] { launcher(); }); }

void Registrations::submit_locked(const Ref &r, std::function<void()> fn) {
    jobs_.push_back(Job{r, std::move(fn)});
    launch_cv_.notify_one();
}

// The thread's last act, under the lock, is to say it ended: joining it
// afterwards never waits for work, and nothing of the transport is touched
// once the flag is set (fn and what it holds are gone by then).
std::thread Registrations::start_worker(std::function<void()> fn, std::shared_ptr<bool> ended) {
    return std::thread([this, ended, fn = std::move(fn)]() mutable {
        {
            std::function<void()> run = std::move(fn);
            run();
        }
        std::lock_guard<std::mutex> lk(mu_);
        *ended = true;
    });
}

void Registrations::launcher() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        launch_cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;  // close cancelled what is queued
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        std::vector<std::thread> ended;
        for (auto it = workers_.begin(); it != workers_.end();) {
            if (!*it->ended) {
                ++it;
                continue;
            }
            ended.push_back(std::move(it->thread));
            it = workers_.erase(it);
        }
        lk.unlock();
        for (auto &t : ended) t.join();
        auto flag = std::make_shared<bool>(false);
        std::thread th;
        try {
            th = start_worker(std::move(job.fn), flag);
        } catch (const std::system_error &e) {
            lk.lock();
            finish_locked(job.r, KVX_ENOMEM, strfmt("peer '%s': cannot start a thread to connect: %s",
                                                     job.r->id.c_str(), e.what()));
            continue;
        }
        lk.lock();
        workers_.push_back(Worker{std::move(th), flag});
    }
}

void Registrations::shutdown() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
        jobs_.clear();
        launch_cv_.notify_all();
    }
    if (launcher_.joinable()) launcher_.join();
    std::vector<Worker> workers;
    {
        std::lock_guard<std::mutex> lk(mu_);
        workers.swap(workers_);
    }
    for (auto &w : workers) w.thread.join();  // called off: their waits end within a slice (net::Deadline)
    std::unique_lock<std::mutex> lk(mu_);
    sync_cv_.wait(lk, [&] { return sync_ == 0; });  // called off too
}

void Registrations::sync_ended_locked() {
    if (--sync_ == 0) sync_cv_.notify_all();
}

}  // namespace kvx
