#include "idem/redis_guard.h"
