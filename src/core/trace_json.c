/* What every timeline file shares. See trace_json.h. */
#include "core/trace_json.h"

const char *const dt_trace_lane_names[DT_TRACE_LANES] = {"compute", "communication", "steps"};
const char *const dt_trace_lane_cats[DT_TRACE_LANES] = {"compute", "comm", "step"};

void dt_trace_json_next(FILE *f, int *first)
{
    if (!*first) fputs(",\n", f);
    *first = 0;
}

void dt_trace_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void dt_trace_json_rank(FILE *f, int rank, int *first)
{
    dt_trace_json_next(f, first);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    dt_trace_json_next(f, first);
    fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}}", rank, rank);
    for (int l = 0; l < DT_TRACE_LANES; l++) {
        dt_trace_json_next(f, first);
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"%s\"}}", rank, l, dt_trace_lane_names[l]);
    }
}
