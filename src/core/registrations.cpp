#include "core/registrations.h"

#include <chrono>
#include <exception>
#include <iterator>

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
    r->began_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
    jobs_.push_back(Job{r, std::move(fn), nullptr});
    start_failed_ = false;  // worth another try
    if (idle_ > 0) work_cv_.notify_one();
    if (need_worker_locked()) launch_cv_.notify_one();
}

bool Registrations::need_worker_locked() const {
    return !stopping_ && !start_failed_ && jobs_.size() > idle_ && live_ < kMaxWorkers;
}

// Why a launcher at all: the first worker of a burst must be started by some
// thread, and the caller of kvx_add_remote_peer_async may not pay for a thread
// start (it can take milliseconds on a busy host). Workers could start their
// successors, but then only the first start would need the launcher; it
// starts them all instead, which keeps the cap and the bookkeeping in one
// place. It also joins the workers that ended after their linger.
void Registrations::launcher() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        launch_cv_.wait(lk, [&] { return stopping_ || ended_ > 0 || need_worker_locked(); });
        if (stopping_) return;  // shutdown joins the workers; close cancelled what is queued
        if (ended_ > 0) reap(lk);
        if (need_worker_locked()) start_worker(lk);  // (again: reap let the lock go)
    }
}

// Joins the workers that ended: their last act was to say so, under the lock,
// so joining never waits for work.
void Registrations::reap(std::unique_lock<std::mutex> &lk) {
    std::list<Worker> ended;
    for (auto it = workers_.begin(); it != workers_.end();) {
        auto next = std::next(it);
        if (it->ended) ended.splice(ended.end(), workers_, it);
        it = next;
    }
    ended_ = 0;
    lk.unlock();
    for (auto &w : ended) w.thread.join();
    lk.lock();
}

// One more worker, started without the lock. If none can be started and none
// runs, what is queued fails with KVX_ENOMEM (nothing would ever run it);
// with workers running, they serve the queue and the next submit or worker
// end allows another try.
void Registrations::start_worker(std::unique_lock<std::mutex> &lk) {
    live_++;
    idle_++;  // it takes a job as soon as it runs: no second start for the same job
    auto it = workers_.emplace(workers_.end());
    Worker *w = &*it;
    std::thread th;
    std::string why;
    lk.unlock();
    try {
        th = std::thread([this, w] { work(w); });
    } catch (const std::exception &e) {  // system_error (no thread), bad_alloc
        why = e.what();
    }
    lk.lock();
    if (th.joinable()) {
        w->thread = std::move(th);  // (the worker may have run and ended meanwhile: reap joins it)
        return;
    }
    workers_.erase(it);
    live_--;
    idle_--;
    start_failed_ = true;
    while (live_ == 0 && !jobs_.empty()) {
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        if (!job.r) {
            if (job.dropped) job.dropped();
            continue;
        }
        finish_locked(job.r, KVX_ENOMEM,
                      strfmt("peer '%s': cannot start a thread to connect: %s", job.r->id.c_str(), why.c_str()));
    }
}

void Registrations::work(Worker *self) {
    std::unique_lock<std::mutex> lk(mu_);
    run_jobs(lk);
    live_--;
    idle_--;
    start_failed_ = false;  // a thread fewer: worth another try
    ended_++;
    launch_cv_.notify_one();  // the launcher joins it
    self->ended = true;  // the last act: after it, nothing of the transport is touched but the unlock
}

// Takes jobs, oldest first, until none came for kWorkerLinger (or close).
void Registrations::submit_task_locked(std::function<void()> fn, std::function<void()> dropped) {
    jobs_.push_back(Job{nullptr, std::move(fn), std::move(dropped)});
    start_failed_ = false;
    if (idle_ > 0) work_cv_.notify_one();
    if (need_worker_locked()) launch_cv_.notify_one();
}

void Registrations::run_jobs(std::unique_lock<std::mutex> &lk) {
    for (;;) {
        if (!work_cv_.wait_for(lk, kWorkerLinger, [&] { return stopping_ || !jobs_.empty(); })) return;
        if (stopping_) return;
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        if (job.r && job.r->cancel_code != 0) {  // removed, superseded or closed while queued: already reported
            finish_locked(job.r, job.r->cancel_code, "");
            continue;
        }
        idle_--;
        lk.unlock();
        {
            Job run = std::move(job);
            run.fn();
        }  // fn and what it holds are released without the lock
        lk.lock();
        idle_++;
    }
}

void Registrations::shutdown() {
    std::deque<Job> dropped;
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
        dropped.swap(jobs_);  // close cancelled them: their outcomes are recorded
        launch_cv_.notify_all();
        work_cv_.notify_all();
    }
    dropped.clear();
    if (launcher_.joinable()) launcher_.join();
    std::list<Worker> workers;
    {
        std::lock_guard<std::mutex> lk(mu_);
        workers.swap(workers_);  // (nodes keep their addresses: running workers still hold theirs)
    }
    for (auto &w : workers)  // called off: their waits end within a slice (net::Deadline); idle ones wake
        if (w.thread.joinable()) w.thread.join();
    std::unique_lock<std::mutex> lk(mu_);
    sync_cv_.wait(lk, [&] { return sync_ == 0; });  // called off too
}

void Registrations::sync_ended_locked() {
    if (--sync_ == 0) sync_cv_.notify_all();
}

}  // namespace kvx
