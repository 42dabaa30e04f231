/* Ends one instruction set's instance of cyback_vmath_body.h (included by
 * cyback_vmath.h after each #include of the body): the names the body was
 * written in are undefined for the next set. Deliberately no include guard. */
#undef CB_VM_FN
#undef CB_VM_ATTR
#undef V
#undef VF
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef FMA
#undef FNMA
#undef MIN
#undef MAX
#undef ABS
#undef WITHSIGN
#undef LT
#undef ISNAN
#undef SEL
#undef SCALE2
