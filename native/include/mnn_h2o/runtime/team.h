// A fork-join team of threads, as the attention and the token peaks take it: ThreadPool (workers
// that sleep between calls; the cache's own) or SpinTeam (workers that poll; the decode layers'),
// so that a decode token's products and its attention can share one team whose workers stay awake
// (model/decode_token.h) instead of waking a second team's for every layer.
#pragma once

#include <type_traits>

namespace mnn_h2o {

class Team {
public:
    virtual ~Team() = default;

    // Threads that take tasks, the caller's included.
    virtual int size() const = 0;

    // Whether the workers poll for the next call (SpinTeam between a decode token's products): a
    // call then costs about a microsecond, where waking sleeping workers costs tens.
    virtual bool polling() const { return false; }

    // Runs fn(task, thread) for every task in [0, n_tasks) and returns when all are done. thread
    // is in [0, size()), and no two tasks run at once with the same thread index, so it can index
    // per-thread scratch memory. The first exception a task throws is rethrown here (the tasks
    // not yet started are skipped). A call made from inside one of the team's tasks runs its
    // tasks inline on that thread.
    template <class Fn>
    void parallel_for(int n_tasks, Fn&& fn) {
        using F = std::remove_reference_t<Fn>;
        run_tasks(n_tasks, [](void* c, int task, int thread) { (*static_cast<F*>(c))(task, thread); },
                  const_cast<void*>(static_cast<const void*>(&fn)));
    }

protected:
    using TaskFn = void (*)(void* ctx, int task, int thread);
    virtual void run_tasks(int n_tasks, TaskFn fn, void* ctx) = 0;
};

}  // namespace mnn_h2o
