// Umbrella header: the whole public API of idem.
#pragma once

#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/pg_sink.h"
#include "idem/record.h"
#include "idem/redis_guard.h"
#include "idem/request_id.h"
