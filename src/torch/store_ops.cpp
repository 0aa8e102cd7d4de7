// dt_kv_ops over a c10d::Store (store_ops.hpp). A wait polls check()
// rather than calling the store's own timed wait: a timed-out wait may
// leave a TCPStore's reply in flight, and dtrain waits in short slices.
#include "store_ops.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace dtrain_torch {

namespace {

c10d::Store &store_of(void *ctx) { return *static_cast<StoreRef *>(ctx)->store; }

// The store's exception as a dtrain error with its message.
int failed(const char *what, const char *key, const std::exception &e, char *err, size_t errlen)
{
    const c10::Error *ce = dynamic_cast<const c10::Error *>(&e);
    const char *why = ce ? ce->what_without_backtrace() : e.what();
    snprintf(err, errlen, "the process group's store failed to %s '%s': %s", what, key, why);
    return DT_ERR_PEER;
}

int store_set(void *ctx, const char *key, const void *val, size_t len, char *err, size_t errlen)
{
    try {
        const uint8_t *p = static_cast<const uint8_t *>(val);
        store_of(ctx).set(key, std::vector<uint8_t>(p, p + len));
        return 0;
    } catch (const std::exception &e) {
        return failed("set", key, e, err, errlen);
    }
}

int store_get(void *ctx, const char *key, double timeout_s, void **val, size_t *len, char *err,
              size_t errlen)
{
    using clock = std::chrono::steady_clock;
    auto until = clock::now() + std::chrono::duration<double>(timeout_s);
    auto nap = std::chrono::milliseconds(1);
    try {
        c10d::Store &s = store_of(ctx);
        const std::vector<std::string> keys{key};
        while (!s.check(keys)) {
            if (clock::now() >= until) return DT_ERR_TIMEOUT;
            std::this_thread::sleep_for(nap);
            nap = std::min(nap * 2, std::chrono::milliseconds(32));
        }
        std::vector<uint8_t> v = s.get(key);
        *len = v.size();
        *val = malloc(v.size() ? v.size() : 1);
        if (!*val) return DT_ERR_NOMEM;
        if (!v.empty()) memcpy(*val, v.data(), v.size());
        return 0;
    } catch (const std::exception &e) {
        return failed("get", key, e, err, errlen);
    }
}

int store_add(void *ctx, const char *key, int64_t delta, int64_t *result, char *err,
              size_t errlen)
{
    try {
        *result = store_of(ctx).add(key, delta);
        return 0;
    } catch (const std::exception &e) {
        return failed("add to", key, e, err, errlen);
    }
}

} // namespace

const dt_kv_ops store_ops = {store_set, store_get, store_add};

} // namespace dtrain_torch
