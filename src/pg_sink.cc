#include "idem/pg_sink.h"
