/* quantize.h - private to tools/: the plan of `backplane quantize` (quantize-plan.c), which type
 * each tensor of a model gets under one of llama.cpp's file types, and the importance matrix
 * file it reads (quantize-imatrix.c). */
#ifndef BP_TOOLS_QUANTIZE_H
#define BP_TOOLS_QUANTIZE_H

#include <backplane/backplane.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A file type of llama.cpp: its name as llama-quantize spells it ("Q4_K_M"), the value it
 * stores in general.file_type (LLAMA_FTYPE_MOSTLY_Q4_K_M = 15) and the type of the tensors no
 * rule singles out. */
struct quant_ftype {
    const char *name;
    int ftype;
    enum bp_type base;
};

/* The file type named name (case-insensitive), NULL when there is none. */
const struct quant_ftype *quant_ftype_find(const char *name);
/* Every name quant_ftype_find knows, for a usage message. Static storage. */
const char *quant_ftype_names(void);

/* What the rules need to know of the model (from its metadata). */
struct quant_model {
    bool falcon;    /* general.architecture is falcon */
    bool is_70b;    /* llama.cpp's LLM_TYPE_70B: a llama of 80 layers with grouped KV heads */
    int n_layer;    /* <arch>.block_count */
    int n_gqa;      /* heads per KV head (0 when the file does not say) */
    int n_expert;   /* <arch>.expert_count, 0 for a dense model */
};

/* One tensor of the input; the planner fills in the last three members. */
struct quant_item {
    const char *name;
    int64_t ne[4];
    enum bp_type from; /* meaningful when supported */
    bool supported;    /* the input type is one backplane has */
    enum bp_type to;   /* the type it is written in */
    bool quantize;     /* whether the rules apply to it (a weight matrix, not a norm) */
    enum bp_type wanted; /* what the rules chose before a fallback; == to when none */
};

/* Plans the type of every item, as llama.cpp's llama_tensor_get_type does for ft (pure: every
 * weight matrix gets ft->base, only the fallbacks apply; has_imatrix: the rules that depend on
 * an importance matrix). false after printing one sentence on stderr (a tensor whose layer
 * cannot be told, or whose rows fit neither the type nor a fallback). */
bool quant_plan(const struct quant_ftype *ft, const struct quant_model *m, struct quant_item *items,
                size_t n, bool pure, bool has_imatrix);

/* The entries of a legacy importance matrix file (llama.cpp's imatrix .dat): name -> one value
 * per column, already divided by the number of calls as llama-quantize does. */
struct quant_imatrix_entry {
    char *name;
    float *values;
    int64_t n;
};
struct quant_imatrix {
    struct quant_imatrix_entry *e;
    size_t n;
};

/* Reads path into im; false after printing one sentence on stderr naming the file and what is
 * wrong. Free with quant_imatrix_free (also after a failure). */
bool quant_imatrix_load(const char *path, struct quant_imatrix *im);
void quant_imatrix_free(struct quant_imatrix *im);
/* The entry for a tensor name, NULL when the file has none. */
const struct quant_imatrix_entry *quant_imatrix_find(const struct quant_imatrix *im,
                                                     const char *name);

#endif
