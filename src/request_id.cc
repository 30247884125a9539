#include "idem/request_id.h"
