#include "idem/deduplicator.h"
